"""Ranking metrics against values computed by hand."""

from __future__ import annotations

import math

import pytest

from ragchains.evaluation.metrics import (
    citation_match,
    exact_match,
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
