"""Every `ragchains eval` command end to end on small fixture data, as a user runs them."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from ragchains.evaluation.datasets import load_beir, load_qa
from ragchains.evaluation.metrics import ndcg_at_k
from ragchains.evaluation.runs import load_run
from ragchains.retrievers.fusion import FUSION_FIELDS, FusionConfig
from ragchains.retrievers.fusionfile import read_fusion
from tests.conftest import FIXTURES, REPO
from tests.test_cli import run

pytestmark = pytest.mark.e2e

BEIR = FIXTURES / "eval" / "beir-mini"
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("eval")


def test_retrieval_writes_a_run_per_retriever_and_reuses_the_index(work: Path) -> None:
    out = work / "retrieval"
    result = run(
        "eval", "retrieval", "--dataset", BEIR, "--index", work / "beir-index", "--out", out,
        "--retriever", "bm25", "--retriever", "dense", "--retriever", "hybrid+compress", "-q",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "building the index" in result.stderr
    assert "mini/bm25" in result.stdout and "ndcg@10" in result.stdout
    data = load_beir(BEIR)
    for name in ("bm25", "dense", "hybrid-compress"):
        found = load_run(out / name)
        items = found.items()
        assert [i["id"] for i in items] == ["q1", "q2", "q3", "q4"]
        for item in items:  # each item's figures follow from its own ranking
            assert item["ndcg@10"] == pytest.approx(
                ndcg_at_k(item["top10"], data.qrels[item["id"]], 10)
            )
        for metric in ("ndcg@10", "recall@10", "recall@100", "mrr@10"):
            mean = sum(i[metric] for i in items) / len(items)
            assert found.metrics[metric] == pytest.approx(mean)
        assert found.config["versions"]["bm25s"] and found.config["documents"] == 8
    bm25 = {i["id"]: i for i in load_run(out / "bm25").items()}
    # One relevant document sharing the query's rare words: found first.
    assert [bm25[q]["ndcg@10"] for q in ("q2", "q3", "q4")] == [1.0, 1.0, 1.0]
    assert bm25["q1"]["top10"][:2] == ["d1", "d2"] and bm25["q1"]["ndcg@10"] == pytest.approx(1.0)
    config = load_run(out / "hybrid-compress").config
    assert config["fusion_label"] == "convex zscore alpha=0.55"
    assert config["fusion_from"] == {"settings": [], "index_fusion_json": False}
    assert config["compressor"]["kind"] in ("cross-encoder", "embedding-similarity")

    again = run(
        "eval", "retrieval", "--dataset", BEIR, "--index", work / "beir-index",
        "--out", work / "retrieval-again", "--retriever", "bm25", "-q",
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "reusing the index" in again.stderr
    assert load_run(work / "retrieval-again" / "bm25").metrics == load_run(out / "bm25").metrics

    taken = run("eval", "retrieval", "--dataset", BEIR, "--out", out, "-q")
    assert taken.returncode == 2 and taken.stderr.strip().endswith("choose another --out folder")


def test_retrieval_through_the_chat_rewrite_records_what_was_searched(work: Path) -> None:
    """rewrite+hybrid: each query is a chat's first turn, rewritten by the embedded model."""
    out = work / "rewrite"
    result = run(
        "eval", "retrieval", "--dataset", BEIR, "--index", work / "beir-index", "--out", out,
        "--retriever", "rewrite+hybrid", "--limit", "2", "-q",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    found = load_run(out / "rewrite-hybrid")
    items = found.items()
    assert [i["id"] for i in items] == ["q1", "q2"]
    for item in items:
        assert item["search_query"].strip()
        assert isinstance(item["filters"], list) and isinstance(item["alternatives"], list)
        assert len(item["top10"]) > 0
    assert found.config["retriever"] == "rewrite+hybrid"


def test_summary_plot_and_diff_read_the_runs(work: Path) -> None:
    plot = work / "runs.png"
    result = run("eval", "summary", work / "retrieval", "--plot", plot)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["run", "kind", "n", "ndcg@10", "recall@10", "recall@100", "mrr@10"]
    assert len(lines) == 5 and plot.read_bytes().startswith(PNG)

    diff = run("eval", "diff", work / "retrieval" / "bm25", work / "retrieval" / "dense")
    assert diff.returncode == 0, diff.stderr
    assert "items changed" in diff.stdout

    mixed = run("eval", "diff", work / "retrieval" / "bm25", work / "abstention-missing")
    assert mixed.returncode == 2 and mixed.stderr.startswith("error: ")
    assert "is not an evaluation run" in mixed.stderr


def test_abstention_sweeps_and_recommends_without_an_llm(work: Path) -> None:
    out = work / "abstention"
    result = run(
        "eval", "abstention", "--dataset", BEIR, "--index", work / "beir-index", "--out", out,
        "--max-false-abstain", "0.25", "-q",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "recommended: RAGCHAINS_RERANK_THRESHOLD=" in result.stdout
    assert "recommended: RAGCHAINS_REQUERY_THRESHOLD=" in result.stdout
    found = load_run(out)
    assert (out / "sweep.png").read_bytes().startswith(PNG)
    items = found.items()
    assert len(items) == 4 and all(i["removed_documents"] >= 1 for i in items)
    m = found.metrics
    assert m["recommended_false_abstain_rate"] <= 0.25
    assert m["recommended_requery_threshold"] >= m["recommended_threshold"]
    sweep = found.summary["sweep"]
    thresholds = [p["threshold"] for p in sweep]
    assert thresholds == sorted(thresholds)
    # Rates only grow with the threshold, and end at 1 above every best score.
    assert all(a["abstain_rate"] <= b["abstain_rate"] for a, b in itertools.pairwise(sweep))
    assert sweep[-1]["abstain_rate"] == 1.0 and sweep[-1]["false_abstain_rate"] == 1.0
    best = [i["best_score_unanswerable"] for i in items]
    chosen = m["recommended_threshold"]
    assert m["recommended_abstain_rate"] == pytest.approx(sum(b < chosen for b in best) / 4)


def test_rewrites_score_the_real_rewrite_chain(work: Path) -> None:
    out = work / "rewrites"
    result = run(
        "eval", "rewrites", "--dataset", FIXTURES / "eval" / "rewrites.jsonl", "--out", out, "-q"
    )
    assert result.returncode == 0, result.stderr
    found = load_run(out)
    items = {i["id"]: i for i in found.items()}
    assert items["c1_1"]["raw_exact_match"] == 1.0  # a first turn needs no rewrite
    assert items["c1_2"]["raw_token_f1"] == pytest.approx(4 / 7)
    assert all(i["rewrite"] for i in items.values())
    assert found.config["prompts"] == {"rewrite": "default/rewrite@v1"}
    assert found.metrics["followup_raw_token_f1"] == pytest.approx(
        (items["c1_2"]["raw_token_f1"] + items["c1_3"]["raw_token_f1"]) / 2
    )
    # The run records the prompt version that ran, not the latest.
    older = work / "rewrites-hr-v1"
    args = ["--domain", "hr", "--prompt-version", "rewrite=1", "--limit", "1", "-q"]
    dataset = FIXTURES / "eval" / "rewrites.jsonl"
    result = run("eval", "rewrites", "--dataset", dataset, "--out", older, *args)
    assert result.returncode == 0, result.stderr
    assert load_run(older).config["prompts"] == {"rewrite": "hr/rewrite@v1"}


def test_answers_in_process_with_and_without_a_judge(work: Path, sample_index: Path) -> None:
    # One answerable question and one the documents do not answer: each judged three ways.
    dataset = work / "qa.jsonl"
    dataset.write_text(
        "".join(
            line + "\n"
            for line in (FIXTURES / "eval" / "qa.jsonl").read_text().splitlines()
            if json.loads(line)["id"] in ("pto", "worldcup")
        )
    )
    config = work / "answers.yaml"
    config.write_text(
        f"dataset: {dataset}\ntarget: {{index: {sample_index}, mode: ask, domain: hr}}\n"
        "judge: {provider: embedded}\n",
        encoding="utf-8",
    )
    result = run("eval", "answers", "--config", config, "--out", work / "answers", "-q")
    assert result.returncode == 0, result.stderr
    found = load_run(work / "answers")
    items = {i["id"]: i for i in found.items()}
    assert items["worldcup"]["abstained"] is True  # nothing passes the threshold
    assert items["worldcup"]["citation_match"] is None
    for item in items.values():
        assert {"latency", "answer_length", "has_citation", "abstained"} <= set(item)
        for judged in ("groundedness", "relevance", "dontknowness"):
            assert item[judged] in (1, 2, 3, 4, 5), item
    assert found.summary["skipped"] == []
    # The embedded model quotes by default: every sentence is found in the source it cites.
    assert {i["answer_style"] for i in items.values()} == {"quote"}
    assert any(i["abstained"] is False for i in items.values())  # some answer was checked
    assert found.metrics["faithfulness"] == 1.0
    assert found.label.endswith("-auto")
    assert found.config["judge"]["prompts"]["groundedness"] == "default/groundedness@v1"

    config.write_text(f"dataset: {dataset}\ntarget: {{index: {sample_index}}}\n", encoding="utf-8")
    plain = run(
        "eval",
        "answers",
        "--config",
        config,
        "--answer-style",
        "free",
        "--out",
        work / "answers-plain",
        "--limit",
        "1",
        "-q",
    )
    assert plain.returncode == 0, plain.stderr
    assert "skipped" in plain.stdout and "no judge" in plain.stderr
    free = load_run(work / "answers-plain")
    assert free.metrics["groundedness"] is None and "faithfulness" in free.metrics
    assert free.config["target"]["configurable"] == {"answer_style": "free"}
    assert [i["answer_style"] for i in free.items()] == ["free"] and free.label.endswith("-free")

    config.write_text("dataset: qa.jsonl\ntarget: {}\n", encoding="utf-8")
    bad = run("eval", "answers", "--config", config, "--out", work / "answers-bad")
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        f"error: {config}: target: give exactly one of target.index and target.url"
    )


def test_found_searches_follow_ups_three_ways(work: Path, sample_index: Path) -> None:
    """`eval found` on the samples' first conversations: a first question, two unanswerable
    ones and two follow-ups, each follow-up searched raw, standalone and as the chat does."""
    out = work / "found"
    dataset = REPO / "evaluation" / "qa" / "samples-chat.jsonl"
    args = ["--index", sample_index, "--dataset", dataset, "--limit", "5", "--out", out, "-q"]
    result = run("eval", "found", *args)
    assert result.returncode == 0, result.stderr
    found = load_run(out)
    assert found.config["kind"] == "found"
    metrics = found.metrics
    assert (metrics["questions"], metrics["unanswerable"], metrics["followups"]) == (3, 2, 2)
    assert metrics["cut_unanswerable"] == 1.0  # the capital of Mongolia finds nothing here
    items = {i["id"]: i for i in found.items()}
    children = items["plan-children-2"]
    assert children["found_standalone"] and children["found_raw"]
    # The chat searched the follow-up as asked beside whatever the rewrite made of it.
    assert "And how much is it to add children?" in children["searched"]
    assert children["found_chat"]


def test_generate_writes_ground_truth_that_answers_reads(work: Path, sample_index: Path) -> None:
    out = work / "generated.jsonl"
    result = run(
        "eval", "generate", "--index", sample_index, "--out", out,
        "--count", "3", "--unanswerable", "3", "-q",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("wrote ")
    items = load_qa(out)
    assert items and {i.kind for i in items} <= {
        "answerable", "unrelated", "related-absent", "nonsensical"
    }  # fmt: skip
    for item in items:
        assert item.question.endswith("?")
        assert item.answerable == bool(item.citations)

    again = run("eval", "generate", "--index", sample_index, "--out", out)
    assert again.returncode == 2 and "already exists" in again.stderr


def test_tune_sweeps_on_train_reports_on_test_and_writes_fusion_json(work: Path) -> None:
    index, out = work / "tune-index", work / "tune"
    result = run("eval", "tune", "--dataset", BEIR, "--index", index, "--out", out, "-q")
    assert result.returncode == 0, result.stderr
    assert "recommended (best nDCG@10 on train): " in result.stdout
    assert "as settings:  RAGCHAINS_FUSION=" in result.stdout
    found = load_run(out)
    assert found.config["queries"] == {"train": 4, "test": 4}
    items = {i["id"]: i for i in found.items()}
    assert len(items) == found.summary["count"] > 80
    assert {"convex tmm alpha=0.8", "convex minmax alpha=0.5", "rrf k=60 bm25:dense=1:1"} <= set(
        items
    )
    best = max(items.values(), key=lambda i: i["ndcg@10_train"])
    assert found.metrics["tuned@train"] == best["ndcg@10_train"]
    assert found.summary["recommended_label"] == best["id"]
    assert (out / "sweep.png").read_bytes().startswith(PNG)
    recommended = json.loads((out / "fusion.json").read_text(encoding="utf-8"))
    assert (
        recommended["format"] == "ragchains-fusion" and recommended["tuned"]["tuned_on"] == "train"
    )
    assert FusionConfig(**{k: recommended[k] for k in FUSION_FIELDS}).describe() == best["id"]

    # The sweep fuses in memory exactly as the retriever does: its figures on test are the
    # ones `eval retrieval` gives the same settings.
    for env, name in (
        ({}, "convex zscore alpha=0.55"),
        ({"RAGCHAINS_FUSION": "rrf"}, "rrf k=60 bm25:dense=1:1"),
    ):
        check = work / f"tune-check-{name.split()[0]}"
        result = run(
            "eval", "retrieval", "--dataset", BEIR, "--index", index, "--out", check,
            "--retriever", "hybrid", "-q", env=env,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        hybrid = load_run(check / "hybrid")
        assert hybrid.config["fusion_label"] == name
        assert {"ndcg@10", "recall@10", "recall@100", "mrr@10"} <= set(hybrid.metrics)
        assert hybrid.metrics == {m: items[name][f"{m}_test"] for m in hybrid.metrics}

    # --apply writes it into an index folder, whose retriever then defaults to it; settings
    # still win, field by field.
    result = run(
        "eval", "tune", "--dataset", BEIR, "--index", index, "--out", work / "tune-apply",
        "--apply", index, "-q",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"written to {index / 'fusion.json'}" in result.stdout
    assert read_fusion(index) == FusionConfig(**{k: recommended[k] for k in FUSION_FIELDS})
    after = work / "after-apply"
    result = run(
        "eval", "retrieval", "--dataset", BEIR, "--index", index, "--out", after,
        "--retriever", "hybrid", "-q", env={"RAGCHAINS_RRF_K": "7"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    config = load_run(after / "hybrid").config
    assert config["fusion_from"] == {"settings": ["rrf_k"], "index_fusion_json": True}
    assert config["fusion"] == {**{k: recommended[k] for k in FUSION_FIELDS}, "rrf_k": 7}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tune-split", "test"], "error: --tune-split and --split are both 'test': "),
        (["--tune-split", "dev"], "qrels/dev.tsv is missing"),
        (["--apply", "nowhere"], "error: --apply: no index at nowhere"),
    ],
)
def test_tune_refuses_bad_input_in_one_line(work: Path, args: list[str], message: str) -> None:
    result = run("eval", "tune", "--dataset", BEIR, "--out", work / "tune-bad", *args)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_bad_dataset_is_one_line(work: Path) -> None:
    result = run("eval", "retrieval", "--dataset", work / "nothing-here", "-q")
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: no dataset folder at {work / 'nothing-here'}"
    result = run("eval", "rewrites", "--dataset", FIXTURES / "eval" / "qa.jsonl")
    assert result.returncode == 2
    assert "'raw' and 'rewrite' must be text" in result.stderr
