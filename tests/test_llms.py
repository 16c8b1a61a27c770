"""Chat model providers: the real embedded SmolLM2 and an OpenAI-compatible endpoint.

The OpenAI-compatible side talks to a small HTTP server started here on a free port, which
answers like the real API (or fails on purpose), so retries, timeouts and the fallback model
are exercised through the real client over real sockets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from langchain_core.messages import HumanMessage, SystemMessage

from ragchains.chains.llm import LLM
from ragchains.models.embedded import embedded_llm, packaged_gguf
from ragchains.models.providers import LLMConfigError, openai_llm
from tests.servers import FakeOpenAI, fake_openai_server


# ----------------------------------------------------------------------------- embedded
def test_packaged_model_is_found() -> None:
    path = packaged_gguf()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000


def test_embedded_counts_with_its_own_tokenizer(smollm: LLM) -> None:
    client = smollm.model.model.client  # type: ignore[union-attr]  # behind its queue
    text = "Brightwater's Standard plan costs $45.00 per month."
    assert smollm.count_tokens(text) == len(client.tokenize(text.encode(), add_bos=False))
    assert smollm.model.get_num_tokens(text) == smollm.count_tokens(text)  # type: ignore[union-attr]
    assert smollm.count_tokens("") == 0


def test_embedded_grammar_constrains_the_reply(smollm: LLM) -> None:
    model = smollm.bound(temperature=0.0, max_tokens=8, grammar='root ::= "yes" | "no"\n')
    reply = model.invoke([HumanMessage("Is water wet? Answer yes or no.")])
    assert reply.content in {"yes", "no"}


def test_embedded_model_serves_concurrent_calls(smollm: LLM) -> None:
    """One llama.cpp context, three threads at once: calls queue, none corrupts another."""
    model = smollm.bound(temperature=0.0, max_tokens=6, grammar="root ::= [0-9]{1,3}\n")
    prompts = [[SystemMessage("Reply with a number."), HumanMessage(f"{n} + 1 = ?")] for n in "123"]
    replies = model.batch(prompts, {"max_concurrency": 3})
    assert len(replies) == 3 and all(r.content.isdigit() for r in replies)


def test_embedded_model_serves_concurrent_async_streams(smollm: LLM) -> None:
    """Async streams advance from executor threads; the lock must survive that."""
    model = smollm.bound(temperature=0.0, max_tokens=6, grammar="root ::= [a-z]{2,5}\n")

    async def one(word: str) -> str:
        parts = [c.content async for c in model.astream([HumanMessage(f"Say {word}.")])]
        return "".join(str(p) for p in parts)

    async def together() -> list[str]:
        return list(await asyncio.gather(one("hello"), one("bye"), one("yes")))

    replies = asyncio.run(together())
    assert len(replies) == 3 and all(r.isalpha() and r.islower() for r in replies)


def test_embedded_prompt_cache_reads_only_what_a_prompt_adds(smollm: LLM) -> None:
    """A turn's calls alternate (rewrite, answer): a prompt that begins as one two calls
    back did starts from the cached state and reads only its new end, and replies as a
    model without the cache does."""
    import llama_cpp

    client = smollm.model.model.client  # type: ignore[union-attr]  # behind its queue
    system = SystemMessage("You answer questions about the Brightwater handbook. " * 12)
    second = [system, HumanMessage("Who approves travel over 500 euros?")]
    model = smollm.bound(temperature=0.0, max_tokens=8)
    model.invoke([system, HumanMessage("How many days of paid time off?")])
    model.invoke([HumanMessage("Say hello.")])  # the context now holds another prompt

    def prompt_tokens_read() -> int:
        return int(llama_cpp.llama_perf_context(client.ctx).n_p_eval)

    before = prompt_tokens_read()
    reply = model.invoke(second)
    read = prompt_tokens_read() - before
    whole = smollm.count_tokens(str(system.content))
    assert 0 < read < whole / 2, (read, whole)
    # What the cache keeps is what it counts: not the 100 MB of a batch's logits per state.
    kept = list(client.cache.cache_state.values())
    assert kept and all(state.scores.nbytes < 1 << 20 for state in kept)
    assert client.cache.cache_size <= client.cache.capacity_bytes
    uncached = embedded_llm(prompt_cache_mb=0).bound(temperature=0.0, max_tokens=8)
    assert uncached.invoke(second).content == reply.content


def test_missing_model_file_is_a_clear_error(tmp_path: Any) -> None:
    with pytest.raises(LLMConfigError, match="does not exist"):
        embedded_llm(tmp_path / "nope.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model")
    with pytest.raises(LLMConfigError, match="cannot load"):
        embedded_llm(bad)


# ----------------------------------------------------------------------------- OpenAI-compatible
@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    with fake_openai_server() as server:
        yield server


def test_openai_compatible_answers(fake_openai: FakeOpenAI) -> None:
    llm = openai_llm(model="ok-main", base_url=fake_openai.base_url)
    assert llm.tool_calling and not llm.grammar
    reply = llm.bound(temperature=0.0, max_tokens=16).invoke([HumanMessage("hi")])
    assert reply.content == "answer from ok-main"


def test_failing_model_is_retried_then_the_fallback_answers(fake_openai: FakeOpenAI) -> None:
    llm = openai_llm(
        model="down", base_url=fake_openai.base_url, max_retries=2, fallback_model="ok-backup"
    )
    reply = llm.bound(temperature=0.0, max_tokens=16).invoke([HumanMessage("hi")])
    assert reply.content == "answer from ok-backup"
    assert fake_openai.requests == {"down": 3, "ok-backup": 1}  # 1 try + 2 retries, then backup


def test_failure_without_fallback_surfaces(fake_openai: FakeOpenAI) -> None:
    llm = openai_llm(model="down", base_url=fake_openai.base_url, max_retries=0)
    with pytest.raises(openai.InternalServerError):
        llm.model.invoke([HumanMessage("hi")])


def test_timeout_is_enforced(fake_openai: FakeOpenAI) -> None:
    llm = openai_llm(model="slow", base_url=fake_openai.base_url, timeout=0.3, max_retries=0)
    with pytest.raises(openai.APITimeoutError):
        llm.model.invoke([HumanMessage("hi")])


def test_tools_bind_through_the_fallback(fake_openai: FakeOpenAI) -> None:
    llm = openai_llm(model="down", base_url=fake_openai.base_url, fallback_model="ok-backup")
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    bound = llm.bound(temperature=0.0, max_tokens=16, tools=[tool])
    assert bound.invoke([HumanMessage("hi")]).content == "answer from ok-backup"


def test_openai_needs_a_key_or_a_local_base_url() -> None:
    with pytest.raises(LLMConfigError, match="RAGCHAINS_OPENAI_API_KEY"):
        openai_llm(model="gpt-4o-mini")
    assert openai_llm(model="m", api_key="sk-test").name == "m"


def test_credentials_in_an_upstreams_words_are_masked() -> None:
    from ragchains.models.providers import masked

    said = masked("bad key sk-abc123DEF456 for Authorization: Bearer tok.en-1; api_key='k3y' rest")
    assert said == "bad key *** for Authorization: Bearer *** api_key='*** rest"
    assert masked("a risk-assessment-note") == "a risk-assessment-note"


@pytest.mark.parametrize("behaviour", ["garbled", "hollow"])
def test_an_upstream_200_that_is_no_chat_completion_is_the_upstreams_failure(
    behaviour: str,
) -> None:
    """Plain and streamed: an HTML page or JSON without choices is UpstreamReplyError (502),
    not a ValueError or TypeError that looks like ragchains' own."""
    from ragchains.models.providers import UpstreamReplyError, explain_failure, openai_llm
    from tests.servers import fake_openai_server

    with fake_openai_server() as upstream:
        llm = openai_llm(model=behaviour, base_url=upstream.base_url, timeout=5, max_retries=0)
        for call in (llm.model.invoke, lambda text: list(llm.model.stream(text))):
            with pytest.raises(UpstreamReplyError) as failed:
                call("hi")
            failure = explain_failure(failed.value)
            assert failure is not None and not failure.timed_out
            assert "not a chat completion" in failure.message
