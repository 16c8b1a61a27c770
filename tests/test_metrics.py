"""Ranking, text and faithfulness metrics against values computed by hand."""

from __future__ import annotations

import math

import pytest

from ragchains.evaluation.metrics import (
    citation_match,
    cited_sentences,
    exact_match,
    faithful_sentences,
    mrr_at_k,
    ndcg_at_k,
    normalize_text,
    recall_at_k,
    token_f1,
)


def test_ndcg_hand_computed() -> None:
    # Relevant at ranks 2 and 3 of 3 relevant documents.
    ranked = ["x", "a", "b", "y"]
    relevant = {"a": 1.0, "b": 1.0, "c": 1.0}
    dcg = 1 / math.log2(3) + 1 / math.log2(4)
    idcg = 1 / math.log2(2) + 1 / math.log2(3) + 1 / math.log2(4)
    assert ndcg_at_k(ranked, relevant, 10) == pytest.approx(dcg / idcg)
    assert ndcg_at_k(["a", "b", "c"], relevant, 10) == pytest.approx(1.0)
    assert ndcg_at_k(["x", "y"], relevant, 10) == 0.0
    # Graded: a (2) at rank 2, b (1) at rank 1; ideal puts a first.
    graded = {"a": 2.0, "b": 1.0}
    assert ndcg_at_k(["b", "a"], graded, 2) == pytest.approx(
        (1 + 2 / math.log2(3)) / (2 + 1 / math.log2(3))
    )
    # The cut-off applies to both the ranking and the ideal.
    assert ndcg_at_k(["x", "a"], {"a": 1.0}, 1) == 0.0


def test_recall_and_mrr_hand_computed() -> None:
    relevant = {"a": 1.0, "b": 1.0, "z": 0.0}
    assert recall_at_k(["a", "x", "b"], relevant, 2) == 0.5
    assert recall_at_k(["a", "x", "b"], relevant, 3) == 1.0
    assert recall_at_k(["a"], {}, 10) == 0.0
    assert mrr_at_k(["x", "y", "b"], relevant, 10) == pytest.approx(1 / 3)
    assert mrr_at_k(["x", "y", "b"], relevant, 2) == 0.0
    assert mrr_at_k(["z", "a"], relevant, 10) == 0.5  # grade 0 is not relevant


def test_text_normalised_like_squad() -> None:
    assert normalize_text("The  Standard plan's cost!") == "standard plans cost"
    assert exact_match("the standard plan", "Standard plan.") == 1.0
    assert exact_match("standard plan cost", "standard plan") == 0.0


def test_token_f1_hand_computed() -> None:
    # prediction: health plan cost children (4); reference: cost of adding children to plan (6)
    # shared: plan, cost, children = 3 -> P = 3/4, R = 3/6, F1 = 2PR/(P+R) = 0.6
    assert token_f1("health plan cost children", "cost of adding children to plan") == (
        pytest.approx(0.6)
    )
    # Multiplicity counts: "plan plan" vs "plan" -> P = 1/2, R = 1 -> 2/3.
    assert token_f1("plan plan", "plan") == pytest.approx(2 / 3)
    assert token_f1("x", "y") == 0.0
    assert token_f1("", "") == 1.0 and token_f1("the", "plan") == 0.0


def test_citation_match_needs_every_gold_label() -> None:
    assert citation_match(["a.md#x", "b.md#y"], ["a.md#x"])
    assert not citation_match(["a.md#x"], ["a.md#x", "b.md#y"])
    assert citation_match([], [])


SOURCES = {
    "a.md#x": ["Employees get 25 days\nof paid time off per year, accrued monthly."],
    "b.pdf#page=2": ["Hotels are reimbursed up to $220 per night.", "Book early."],
}


@pytest.mark.parametrize(
    ("answer", "found", "sentences"),
    [
        # Quotes, each with its label: every sentence is in the source it cites.
        ("Employees get 25 days of paid time off per year, accrued monthly. [a.md#x]", 1, 1),
        (
            "Hotels are reimbursed up to $220 per night. [b.pdf#page=2] Book early. [b.pdf#page=2]",
            2,
            2,
        ),
        # Whitespace collapsed on both sides; a closing period may differ from the source's.
        ("Employees  get 25\ndays [a.md#x].", 1, 1),
        ("Employees get 25 days of paid time off per year [a.md#x].", 1, 1),
        # Several labels in one marker, or markers side by side: any of them may hold it.
        ("Book early [a.md#x; b.pdf#page=2].", 1, 1),
        ("Book early [a.md#x] [b.pdf#page=2].", 1, 1),
        # Found in a source, but not in the one cited.
        ("Book early. [a.md#x]", 0, 1),
        # Paraphrase; an unknown label; text after the last marker, citing nothing.
        ("Staff get twenty-five days off. [a.md#x]", 0, 1),
        ("Book early. [c.md]", 0, 1),
        ("Book early. [b.pdf#page=2] You will love it.", 1, 2),
        # Several sentences before one marker are checked one by one.
        ("Book early. Hotels are cheap. [b.pdf#page=2]", 1, 2),
        # No marker at all; nothing but punctuation around markers.
        ("Employees get 25 days.", 0, 1),
        ("[a.md#x].", 0, 0),
        ("", 0, 0),
    ],
)
def test_faithfulness_counts_sentences_found_verbatim_in_a_cited_source(
    answer: str, found: int, sentences: int
) -> None:
    assert faithful_sentences(answer, SOURCES) == (found, sentences)


def test_cited_sentences_pair_each_sentence_with_its_labels() -> None:
    assert cited_sentences("A one [x]. B two [y; z] [w]. C three") == [
        ("A one", ["x"]),
        ("B two", ["y", "z", "w"]),
        ("C three", []),
    ]


def test_a_quoted_table_row_and_record_are_checked_row_by_row_and_field_by_field() -> None:
    """A quote shown as Markdown (chains.quote): the header and the row are each found in the
    cited chunk, the rule line states nothing, a record's '- **field:** value' lines are its
    chunk's 'field: value' lines (escapes undone)."""
    sources = {
        "plans.md#plans": ["| Plan | Cost |\n|------|------|\n| Basic | $0 |\n| Standard | $45 |"],
        "items.csv#row=2": ["sku: BW_7\nname: Auger\nprice: 34.0"],
    }
    table = "| Plan | Cost |\n| --- | --- |\n| Standard | $45 |\n\n[plans.md#plans]"
    assert faithful_sentences(table, sources) == (2, 2)
    record = "- **sku:** BW\\_7\n- **name:** Auger\n- **price:** 35.0\n\n[items.csv#row=2]"
    assert faithful_sentences(record, sources) == (2, 3)  # the price is not the source's
