"""The server under hostile input: each case is a reproduction from the probe that found it
(issue 15), sent to the real app under uvicorn; each must get a 4xx with its reason, never a
500 or a stall, and leave the server healthy."""

from __future__ import annotations

import fnmatch

import httpx
import pytest

from ragchains.retrievers.filters import (
    MAX_GLOB_CHARS,
    MAX_IN_VALUES,
    MAX_VALUE_CHARS,
    FilterError,
    MetadataColumns,
    MetadataFilter,
    validate_filters,
)

pytestmark = pytest.mark.slow


def retrieve(url: str, filters: list[dict[str, object]], query: str = "sensor") -> httpx.Response:
    body = {
        "input": {"query": query, "filters": filters},
        "config": {"configurable": {"domain": "catalog"}},
    }
    return httpx.post(f"{url}/retrieve/invoke", json=body, timeout=60)


# ----------------------------------------------------------------------------- 1. filter size
def test_a_huge_in_list_is_refused_at_once_and_a_full_one_is_answered(sample_server: str) -> None:
    """16,000 values took 37.5 s (the list formatted once per item) and blocked /healthz."""
    huge = retrieve(sample_server, [{"field": "price", "op": "in", "value": list(range(16000))}])
    assert huge.status_code == 422
    assert str(MAX_IN_VALUES) in huge.text and len(huge.text) < 2000  # not the list echoed
    full = [*range(MAX_IN_VALUES - 1), 34.0]  # the auger's price, last of 1,000
    in_full = [{"field": "price", "op": "in", "value": full}]
    answered = retrieve(sample_server, in_full, "probe installation auger")
    assert answered.status_code == 200
    assert [d["metadata"]["price"] for d in answered.json()["output"]][:1] == [34.0]
    assert httpx.get(f"{sample_server}/healthz").status_code == 200


def test_a_bad_value_at_the_end_of_a_long_list_is_named_briefly() -> None:
    values: list[object] = [*range(MAX_IN_VALUES - 1), "x"]
    with pytest.raises(FilterError) as caught:
        validate_filters([{"field": "price", "op": "in", "value": values}], {"price": "number"})
    message = str(caught.value)
    assert "expected a number, got 'x'" in message and f"({MAX_IN_VALUES} values)" in message
    assert len(message) < 300
    with pytest.raises(FilterError, match="limit is 16"):
        validate_filters([{"field": "price", "op": ">", "value": 1}] * 17, {"price": "number"})


# ----------------------------------------------------------------------------- 2. glob memory
def test_long_globs_are_refused_and_globs_do_not_grow_fnmatchs_cache(sample_server: str) -> None:
    """30 distinct 200 KB globs kept 34 MB in fnmatch's pattern cache (32,768 entries)."""
    for size, limit in ((200_000, MAX_VALUE_CHARS), (MAX_GLOB_CHARS + 1, MAX_GLOB_CHARS)):
        glob = "*" + "a" * (size - 1)
        refused = retrieve(sample_server, [{"field": "source", "op": "=", "value": glob}])
        assert refused.status_code == 422 and str(limit) in refused.text, size
        assert len(refused.text) < 2000

    columns = MetadataColumns(
        [{"source": "docs/a.pdf"}, {"source": "docs/b.md"}], {"source": "string"}
    )
    before = fnmatch._compile_pattern.cache_info().currsize  # type: ignore[attr-defined]
    for n in range(50):
        glob = MetadataFilter(field="source", op="=", value=f"docs/*{n}*")
        columns.mask([glob])
    assert fnmatch._compile_pattern.cache_info().currsize == before  # type: ignore[attr-defined]
    pdf = MetadataFilter(field="source", op="=", value="docs/*.pdf")
    assert columns.mask([pdf]).tolist() == [True, False]
