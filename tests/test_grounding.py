"""Grounded filters: a model's filter is kept only when the user wrote its value, and ranges
the question states are read by rule (chains.grounding)."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from ragchains.chains.grounding import extract_ranges, ground_filters, is_grounded, numbers_in
from ragchains.chains.rewrite import create_rewrite_chain
from ragchains.prompts.registry import CHAIN_PROMPTS, PromptRegistry
from ragchains.retrievers.filters import MetadataFilter
from tests.test_rewrite_chain import FIELDS, call, tool_llm

PRICE = ["price", "cost", "cheap", "expensive", "dollars", "usd", "$", "€", "£"]
RANGES = {"price": PRICE, "rating": ["rated", "stars"]}


def f(field: str, op: str, value: Any) -> MetadataFilter:
    return MetadataFilter.model_validate({"field": field, "op": op, "value": value})


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("which sensors cost less than 50 dollars?", ["price < 50"]),
        ("sensors under $50", ["price < 50"]),
        ("anything below 20 USD?", ["price < 20"]),
        ("a gateway cheaper than €120", ["price < 120"]),
        ("meters for at most $1,299.99", ["price <= 1299.99"]),
        ("up to 80 dollars", ["price <= 80"]),
        ("no more than 15 dollars please", ["price <= 15"]),
        ("products priced over 100 dollars", ["price > 100"]),
        ("above $2.5k", ["price > 2500"]),
        ("more expensive than 300 dollars", ["price > 300"]),
        ("at least 10 dollars", ["price >= 10"]),
        ("gateways between $100 and $200", ["price >= 100", "price <= 200"]),
        ("between 10 and 20 dollars", ["price >= 10", "price <= 20"]),
        ("a price between 5 to 9", ["price >= 5", "price <= 9"]),
        ("rated above 4 and cheaper than $30", ["price < 30", "rating > 4"]),
        ("with at least 4 stars", ["rating >= 4"]),
        # No cue for any marked field: nothing is read.
        ("more than 3 channels", []),
        ("under 50", []),
        ("sensors from 2019 with 2 probes", []),
    ],
)
def test_numeric_phrasings(question: str, expected: list[str]) -> None:
    assert [str(x) for x in extract_ranges(question, RANGES)] == expected


def test_numbers_are_read_as_people_write_them() -> None:
    assert numbers_in("costs $1,299.99, or €20, or 2.5k, not x7") == {1299.99, 20.0, 2.5, 2500.0}
    assert numbers_in("between 10 and 20") == {10.0, 20.0}


@pytest.mark.parametrize(
    ("flt", "text", "grounded"),
    [
        (f("price", "<=", 1), "which sensors cost less than 50 dollars?", False),
        (f("price", "<", 50), "which sensors cost less than 50 dollars?", True),
        (f("price", "<", 1299.99), "under $1,299.99", True),
        (f("price", "<", 2500), "under 2.5k", True),
        (f("brand", "=", "Acme"), "acme sensors please", True),
        (f("brand", "=", "Globex"), "acme sensors please", False),
        (f("brand", "in", ["Acme", "Globex"]), "acme or globex?", True),
        (f("brand", "in", ["Acme", "Initech"]), "acme or globex?", False),
        (f("filename", "=", "*.pdf"), "only the pdf files", True),
        (f("filename", "=", "handbook.pdf"), "what does the handbook say", False),
        (f("in_stock", "=", True), "which are in stock?", True),
        (f("in_stock", "=", True), "which are cheap?", False),
    ],
)
def test_a_filter_is_grounded_by_what_the_user_wrote(
    flt: MetadataFilter, text: str, grounded: bool
) -> None:
    assert is_grounded(flt, text) is grounded


def test_grounding_keeps_drops_replaces_and_reads_with_a_note_each() -> None:
    out = ground_filters(
        [f("price", "<=", 1), f("brand", "=", "Globex"), f("brand", "!=", "Acme")],
        question="which sensors cost less than 50 dollars, not acme?",
        range_fields=RANGES,
        fields={"price": "number", "brand": "string", "rating": "number"},
    )
    assert [str(x) for x in out.filters] == ['brand != "Acme"', "price < 50"]
    assert out.notes == [
        "replaced filter price <= 1: the question states the range",
        'dropped filter brand = "Globex": its value is not in what you wrote',
        "filter price < 50 read from the question",
    ]


def test_the_range_rule_needs_the_field_as_a_number_in_the_index() -> None:
    out = ground_filters([], question="under $50", range_fields=RANGES, fields={})
    assert out.filters == [] and out.notes == []


def test_earlier_user_messages_ground_a_filter_but_the_models_do_not() -> None:
    history = [HumanMessage("Do you sell Acme sensors?"), AIMessage("Yes, and Globex ones.")]
    kept = ground_filters([f("brand", "=", "Acme")], question="which are cheap?", history=history)
    assert kept.filters == [f("brand", "=", "Acme")]
    dropped = ground_filters([f("brand", "=", "Globex")], question="which?", history=history)
    assert dropped.filters == [] and dropped.notes


def test_an_ungrounded_filter_from_a_tool_calling_model_is_dropped_with_a_note() -> None:
    reply = AIMessage(
        content="",
        tool_calls=[
            call("search_sources", search_query="soil sensors"),
            call("add_filter", field="price", op="<=", value=1),
            call("add_filter", field="brand", op="=", value="Globex"),
        ],
    )
    chain = create_rewrite_chain(
        llm=tool_llm(reply), prompts=PromptRegistry(required=CHAIN_PROMPTS), fields=FIELDS
    )
    out = chain.invoke(
        {"question": "which soil sensors cost less than 50 dollars?"},
        {"configurable": {"domain": "catalog"}},
    )
    assert [str(x) for x in out.filters] == ["price < 50"]
    assert 'dropped filter brand = "Globex": its value is not in what you wrote' in out.notes
    assert "replaced filter price <= 1: the question states the range" in out.notes
