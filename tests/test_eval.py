"""Evaluation logic against hand-computed values: rewrites, answers, judge, abstention, runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models import FakeListChatModel

from ragchains.chains.llm import LLM
from ragchains.evaluation.abstention import (
    SweepPoint,
    default_thresholds,
    recommend,
    requery_threshold,
    sweep,
)
from ragchains.evaluation.answers import (
    Judge,
    TargetError,
    TurnError,
    evaluate_answers,
    load_answers_config,
    measure,
    summarize_answers,
)
from ragchains.evaluation.datasets import (
    DatasetError,
    QAItem,
    RewriteItem,
    load_beir,
    load_qa,
    load_rewrites,
)
from ragchains.evaluation.generate import parse_pair, parse_question, supported
from ragchains.evaluation.metrics import token_f1
from ragchains.evaluation.rewrites import score_rewrite
from ragchains.evaluation.runs import (
    RunError,
    RunWriter,
    diff_runs,
    find_runs,
    load_run,
    summary_table,
)
from tests.conftest import FIXTURES

EVAL = FIXTURES / "eval"


def test_content_f1_leaves_out_stop_words() -> None:
    # "is" is a stop word: prediction [throat cancer treatable] vs the same three -> 1.0,
    # where plain token F1 has P = 3/3, R = 3/4 -> 6/7.
    assert token_f1("throat cancer treatable", "Is throat cancer treatable?") == pytest.approx(
        6 / 7
    )
    assert token_f1(
        "throat cancer treatable", "Is throat cancer treatable?", ignore={"is"}
    ) == pytest.approx(1.0)


def test_rewrite_scores_hand_computed() -> None:
    item = RewriteItem("t", [{"type": "human", "content": "x"}], "Is it treatable?", "")
    item.rewrite = "Is throat cancer treatable?"
    scores = score_rewrite(item, "throat cancer treatable")
    assert scores["token_f1"] == pytest.approx(6 / 7)
    assert scores["content_f1"] == pytest.approx(1.0)
    assert scores["exact_match"] == 0.0
    # raw [is it treatable] vs gold [is throat cancer treatable]: 2 shared -> P 2/3, R 1/2.
    assert scores["raw_token_f1"] == pytest.approx(4 / 7)
    # Without stop words: [treatable] vs [throat cancer treatable] -> P 1, R 1/3 -> 0.5.
    assert scores["raw_content_f1"] == pytest.approx(0.5)
    assert score_rewrite(item, "is throat cancer treatable")["exact_match"] == 1.0


def test_answer_metrics_hand_computed() -> None:
    item = QAItem("pto", "How many PTO days?", "25 days per year", ["handbook.md#pto"])
    turn = {
        "answer": "Employees get 25 days [handbook.md#pto] [x.md#y].",
        "citations": [{"label": "handbook.md#pto"}, {"label": "x.md#y"}],
        "abstained": False,
    }
    row = measure(item, turn, 1.23456)
    assert row["latency"] == 1.2346
    assert row["answer_length"] == 6  # words, citation markers included
    assert row["has_citation"] is True
    assert row["citation_match"] is True
    assert row["abstained"] is False
    # normalised: [employees get 25 days handbookmdpto xmdy] vs [25 days per year]:
    # 2 shared -> P 2/6, R 2/4 -> 0.4
    assert row["answer_f1"] == pytest.approx(0.4)
    missing = measure(item, {**turn, "citations": [{"label": "x.md#y"}]}, 0.5)
    assert missing["citation_match"] is False
    unanswerable = QAItem("u", "Who won?", answerable=False)
    row_u = measure(unanswerable, {"answer": "I don't know", "abstained": True}, 0.1)
    assert row_u["citation_match"] is None and row_u["answer_f1"] is None
    assert row_u["has_citation"] is False and row_u["abstained"] is True
    assert row_u["faithfulness"] is None and row_u["answer_sentences"] == 0


def test_an_answer_holds_the_fact_when_it_says_an_expected_phrase() -> None:
    """Right answers, not only matching citations: ``expect`` phrases, and a cited source
    judged by its file's path (two files of one name are told apart by their folders)."""
    item = QAItem(
        "redirect",
        "What status code does a redirect use by default?",
        expect=["307", "Temporary Redirect"],
        files=["advanced/responses.md"],
    )
    sources = [
        {"label": "index.md#x", "source": "docs/md/index.md", "text": "..."},
        {"label": "responses.md#redirect", "source": "docs/md/advanced/responses.md"},
    ]
    said = {
        "answer": "It returns 307 [responses.md#redirect].",
        "citations": [{"label": "responses.md#redirect"}],
        "sources": sources,
        "abstained": False,
    }
    assert measure(item, said, 1.0)["answer_holds"] is True
    assert measure(item, said, 1.0)["file_cited"] is True
    wrong = {
        **said,
        "answer": "One of these status codes [index.md#x].",
        "citations": [{"label": "index.md#x"}],
    }
    assert measure(item, wrong, 1.0)["answer_holds"] is False
    assert measure(item, wrong, 1.0)["file_cited"] is False
    # An abstention holds no fact, even when the refusal repeats a phrase.
    refused = {**said, "answer": "Not in the documents (307?)", "abstained": True}
    assert measure(item, refused, 1.0)["answer_holds"] is False
    # Sets without expected phrases or files measure neither.
    plain = measure(QAItem("p", "q?", "a", ["l"]), said, 1.0)
    assert plain["answer_holds"] is None and plain["file_cited"] is None
    summary = summarize_answers(
        [{**item.as_dict(), **measure(item, t, 1.0)} for t in (said, wrong)], judged=False
    )
    assert summary["answer_holds"] == 0.5 and summary["file_cited"] == 0.5


def test_a_list_answer_holds_only_when_it_names_every_item() -> None:
    item = QAItem(
        "sensors", "Which sensors cost under $100?", expect_all=["Soil Probe", "Tank Level"]
    )
    one = {"answer": "AquaSense Soil Probe [products.csv#row=1]", "abstained": False}
    both = {**one, "answer": "AquaSense Soil Probe, and the tank level sensor [products.csv]"}
    assert measure(item, one, 1.0)["answer_holds"] is False
    assert measure(item, both, 1.0)["answer_holds"] is True
    assert item.as_dict()["expect_all"] == ["Soil Probe", "Tank Level"]


def test_qa_rows_read_their_standalone_rewrite_phrases_and_files(tmp_path: Path) -> None:
    path = tmp_path / "set.jsonl"
    rows = [
        {"id": "a-1", "conversation": "a", "question": "How do I test an app?", "files": ["t.md"]},
        {
            "id": "a-2",
            "conversation": "a",
            "question": "and with a prompt?",
            "standalone": "How do I test an app that prompts?",
            "expect": ["input="],
            "files": ["t.md"],
        },
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    first, second = load_qa(path)
    assert first.standalone == "" and "standalone" not in first.as_dict()
    assert second.standalone == "How do I test an app that prompts?"
    assert second.as_dict()["expect"] == ["input="] and second.files == ["t.md"]
    path.write_text(json.dumps({"question": "q?", "expect": "input="}) + "\n")
    with pytest.raises(DatasetError, match="'expect' must be a list of text"):
        load_qa(path)


def test_faithfulness_reads_the_sources_the_turn_showed() -> None:
    item = QAItem("pto", "How many PTO days?", "25 days per year", ["handbook.md#pto"])
    turn = {
        "answer": "Employees get 25 days. [handbook.md#pto] They love it. [handbook.md#pto]",
        "citations": [{"label": "handbook.md#pto"}],
        "sources": [
            {"label": "handbook.md#pto", "text": "Intro.\nEmployees get 25\ndays."},
            {"label": "handbook.md#pto", "text": "They love it."},  # a second chunk, one label
        ],
        "abstained": False,
        "answer_style": "quote",
    }
    row = measure(item, turn, 1.0)
    assert (row["faithful_sentences"], row["answer_sentences"]) == (2, 2)
    assert row["faithfulness"] == 1.0 and row["answer_style"] == "quote"
    free = measure(item, {**turn, "answer": "Staff get 25 days off [handbook.md#pto]."}, 1.0)
    assert free["faithfulness"] == 0.0
    # Pooled over every sentence of every answer that does not abstain.
    rows = [
        {**row, "answerable": True},
        {**free, "answerable": True},
        {
            "answerable": False,
            "abstained": True,
            "latency": 1.0,
            "answer_length": 1,
            "answer_sentences": 0,
            "faithful_sentences": 0,
        },
    ]
    assert summarize_answers(rows, judged=False)["faithfulness"] == pytest.approx(2 / 3)


def test_answer_summary_splits_abstention_by_answerability() -> None:
    def row(answerable: bool, abstained: bool, match: bool | None, latency: float) -> Any:
        return {
            "answerable": answerable,
            "abstained": abstained,
            "citation_match": match,
            "has_citation": bool(match),
            "answer_f1": 0.5 if answerable else None,
            "answer_length": 10,
            "latency": latency,
            "groundedness": 4 if answerable else 5,
            "relevance": 3,
            "dontknowness": 5 if not answerable else 1,
        }

    rows = [
        row(True, False, True, 1.0),
        row(True, True, False, 2.0),
        row(True, False, True, 3.0),
        row(False, True, None, 4.0),
        row(False, False, None, 5.0),
        {"answerable": True, "error": "502: overloaded"},
    ]
    m = summarize_answers(rows, judged=True)
    assert m["latency_p50"] == 3.0
    assert m["citation_match"] == pytest.approx(2 / 3)
    assert m["false_abstain_rate"] == pytest.approx(1 / 3)
    assert m["abstain_rate_unanswerable"] == pytest.approx(1 / 2)
    assert m["errors"] == 1
    assert m["groundedness"] == 4.0 and m["dontknowness"] == 5.0 and m["relevance"] == 3.0
    skipped = summarize_answers(rows, judged=False)
    assert skipped["groundedness"] is None and skipped["dontknowness"] is None


def _fake_llm(*replies: str) -> LLM:
    return LLM.of(FakeListChatModel(responses=list(replies)), name="fake")


def test_judge_reads_a_digit_and_marks_junk_as_none() -> None:
    judge = Judge(_fake_llm("4", "Grade: 2", "excellent"))
    turn = {"answer": "25 days", "sources": [{"label": "a#b", "text": "25 days of PTO"}]}
    assert judge.judge("How many days?", turn) == {
        "groundedness": 4,
        "relevance": 2,
        "dontknowness": None,
    }
    assert set(judge.describe()["prompts"].values()) == {
        "default/groundedness@v1",
        "default/relevance@v1",
        "default/dontknowness@v1",
    }


class _ScriptedTarget:
    def __init__(self, turns: list[Any]) -> None:
        self.turns = turns
        self.asked: list[tuple[str, list[Any], str | None]] = []

    def describe(self) -> dict[str, Any]:
        return {"kind": "scripted"}

    def answer(self, question: str, history: Any = (), domain: str | None = None) -> dict[str, Any]:
        self.asked.append((question, list(history), domain))
        turn = self.turns.pop(0)
        if isinstance(turn, Exception):
            raise turn
        return dict(turn)


def test_a_failed_question_is_recorded_and_the_run_goes_on() -> None:
    items = [QAItem("a", "q1?", "x", ["l"]), QAItem("b", "q2?", "y", ["l"])]
    target = _ScriptedTarget(
        [TurnError("502: overloaded"), {"answer": "y [l]", "citations": [{"label": "l"}]}]
    )
    rows: list[dict[str, Any]] = []
    summary = evaluate_answers(items, target, None, on_item=rows.append, progress=False)
    assert rows[0]["error"] == "502: overloaded" and rows[0]["groundedness"] is None
    assert rows[1]["citation_match"] is True
    assert summary["errors"] == 1 and summary["citation_match"] == 1.0


def test_a_conversation_is_asked_turn_by_turn_and_its_queries_checked() -> None:
    """Each turn follows the earlier ones and the target's own answers; the numbers and
    names its searched queries hold that the conversation never did are listed."""
    items = [
        QAItem("c1", "What does the Standard plan cost?", "$45", ["h"], conversation="c"),
        QAItem("c2", "And for children?", "$30", ["h"], conversation="c", domain="hr"),
        QAItem("alone", "Sensors under 100 dollars?", "x", ["p"]),
    ]
    plain = {"answer": "It is $45 [h].", "citations": [{"label": "h"}], "search_query": "q"}
    invents = {
        "answer": "Children cost 10.5 cents.",
        "citations": [],
        "search_query": "And for children? Standard plan cost",
        "alternatives": ["children cost 10.5 cents Berlin"],
        "requery": {"query": "NICESS children", "refused": "it adds a name"},
    }
    target = _ScriptedTarget([plain, invents, {**plain, "search_query": "sensors under 100"}])
    rows: list[dict[str, Any]] = []
    summary = evaluate_answers(items, target, None, on_item=rows.append, progress=False)
    assert target.asked == [
        ("What does the Standard plan cost?", [], None),
        ("And for children?", [("What does the Standard plan cost?", "It is $45 [h].")], "hr"),
        ("Sensors under 100 dollars?", [], None),
    ]
    # The refused re-query was not searched; the phrasing was.
    assert rows[1]["searched"] == [
        "And for children? Standard plan cost",
        invents["alternatives"][0],
    ]
    assert rows[1]["invented"] == ["10.5", "Berlin"] and rows[1]["unmarked_uncited"] is True
    assert rows[0]["invented"] == rows[2]["invented"] == []
    assert summary["invented_terms"] == 2 and summary["unmarked_uncited"] == 1


def test_a_broken_target_stops_the_run_and_a_failing_judge_is_noted() -> None:
    items = [QAItem(str(n), f"q{n}?", "x", ["l"]) for n in range(5)]
    failing = _ScriptedTarget([TurnError("502: down")] * 5)
    rows: list[dict[str, Any]] = []
    with pytest.raises(TargetError, match="the first 3 questions failed: 502: down"):
        evaluate_answers(items, failing, None, on_item=rows.append, progress=False)
    assert len(rows) == 3  # each failure was written before giving up

    class _Timeout(Judge):
        def judge(self, question: str, turn: Any) -> dict[str, int | None]:
            import httpx

            raise httpx.ReadTimeout("slow")

    rows = []
    target = _ScriptedTarget([{"answer": "y", "citations": []}])
    summary = evaluate_answers(
        items[:1], target, _Timeout(_fake_llm("3")), on_item=rows.append, progress=False
    )
    assert rows[0]["judge_error"] == "the chat model did not answer in time"
    assert rows[0]["groundedness"] is None and summary["groundedness"] is None


def test_abstention_sweep_and_recommendation_hand_computed() -> None:
    answerable, unanswerable = [0.9, 0.6, 0.3], [0.5, 0.2, 0.1]
    points = sweep(answerable, unanswerable, [0.25, 0.55])
    assert points == [SweepPoint(0.25, 2 / 3, 0.0), SweepPoint(0.55, 1.0, 1 / 3)]
    assert recommend(points, max_false_abstain=0.0).threshold == 0.25
    assert recommend(points, max_false_abstain=0.34).threshold == 0.55
    # Nothing retrieved counts as the lowest score: always an abstention.
    (point,) = sweep([float("-inf")], [], [0.0])
    assert point.false_abstain_rate == 1.0
    assert default_thresholds([0.123, 0.2, float("-inf")], 0.05) == [0.1, 0.15, 0.2, 0.25]


def test_requery_threshold_is_a_quantile_of_the_answerable_scores_on_the_grid() -> None:
    scores = [0.2, 0.4, 0.6, 0.8, float("-inf")]
    assert requery_threshold(scores, 0.25) == 0.35  # quantile 0.35 of the finite four
    assert requery_threshold(scores, 0.0) == 0.2 and requery_threshold(scores, 1.0) == 0.8
    assert requery_threshold([0.456], 0.5, step=0.05) == 0.45  # rounded down to the grid
    assert requery_threshold([float("-inf")], 0.25) == 0.0


def test_generation_replies_parsed_and_checked() -> None:
    assert parse_pair("Question: How long?\nAnswer: 60 days.\nmore") == ("How long?", "60 days.")
    assert parse_pair("no format") is None
    assert parse_question("What is the capital of France?\nignored") == (
        "What is the capital of France?"
    )
    assert parse_question("Paris") is None
    passage = "Submit expenses within 60 days through the expense tool."
    assert supported("Within 60 days.", passage)
    assert not supported("Three weeks of holiday.", passage)


def test_dataset_errors_name_file_and_line(tmp_path: Path) -> None:
    beir = load_beir(EVAL / "beir-mini")
    assert list(beir.queries) == ["q1", "q2", "q3", "q4"]  # q5 has no judgments
    assert beir.qrels["q1"] == {"d1": 2.0, "d2": 1.0}
    assert beir.document_text(0).startswith("Honey bees\nHoney bees tell")
    assert [i.id for i in load_qa(EVAL / "qa.jsonl")] == ["pto", "wellness", "worldcup"]
    turns = load_rewrites(EVAL / "rewrites.jsonl")
    assert [m["type"] for m in turns[2].history] == ["human", "ai", "human"]

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "ok?"}\n{"question": ""}\n', encoding="utf-8")
    with pytest.raises(DatasetError, match=r"bad.jsonl:2: 'question' must be non-empty"):
        load_qa(bad)
    bad.write_text('{"question": "ok?"}\nnot json\n', encoding="utf-8")
    with pytest.raises(DatasetError, match=r"bad.jsonl:2: not valid JSON"):
        load_qa(bad)
    with pytest.raises(DatasetError, match=r"not a BEIR dataset: corpus\.jsonl is missing"):
        load_beir(tmp_path)
    config = tmp_path / "answers.yaml"
    config.write_text("dataset: qa.jsonl\ntarget: {index: idx, url: http://x/chat}\n", "utf-8")
    with pytest.raises(DatasetError, match=r"give exactly one of target\.index and target\.url"):
        load_answers_config(config)
    config.write_text("dataset: qa.jsonl\ntarget: {index: idx}\njudje: {}\n", "utf-8")
    with pytest.raises(DatasetError, match="judje: Extra inputs are not permitted"):
        load_answers_config(config)


def _write_run(path: Path, label: str, items: list[dict[str, Any]]) -> Path:
    with RunWriter(path, {"kind": "retrieval", "label": label}) as writer:
        for item in items:
            writer.add(item)
        mean = sum(i["ndcg@10"] for i in items) / len(items)
        return writer.finish(
            {
                "count": writer.count,
                "metrics": {"ndcg@10": mean},
                "item_metrics": ["ndcg@10"],
                "item_outputs": ["first_relevant_rank"],
            }
        )


def test_run_folders_summary_and_diff(tmp_path: Path) -> None:
    a = _write_run(
        tmp_path / "runs" / "a",
        "bm25",
        [
            {"id": "q1", "query": "bees", "ndcg@10": 1.0, "first_relevant_rank": 1},
            {"id": "q2", "query": "tides", "ndcg@10": 0.5, "first_relevant_rank": 3},
            {"id": "q3", "query": "rust", "ndcg@10": 0.0, "first_relevant_rank": None},
        ],
    )
    b = _write_run(
        tmp_path / "runs" / "b",
        "dense",
        [
            {"id": "q1", "query": "bees", "ndcg@10": 1.0, "first_relevant_rank": 1},
            {"id": "q2", "query": "tides", "ndcg@10": 0.25, "first_relevant_rank": 4},
            {"id": "q4", "query": "new", "ndcg@10": 1.0, "first_relevant_rank": 1},
        ],
    )
    run = load_run(a)
    assert json.loads((a / "config.json").read_text())["versions"]["python"]
    assert run.metrics == {"ndcg@10": 0.5}
    assert [r.label for r in find_runs([tmp_path / "runs"])] == ["bm25", "dense"]
    table = summary_table(find_runs([tmp_path / "runs"])).splitlines()
    assert table[0].split() == ["run", "kind", "n", "ndcg@10"]
    assert table[2].split() == ["bm25", "retrieval", "3", "0.500"]

    changes, only_a, only_b = diff_runs(load_run(a), load_run(b))
    assert [(c.id, c.changes) for c in changes] == [
        ("q2", {"ndcg@10": (0.5, 0.25), "first_relevant_rank": (3, 4)})
    ]
    assert only_a == ["q3"] and only_b == ["q4"]

    with pytest.raises(RunError, match="already exists"):
        RunWriter(a, {"kind": "retrieval", "label": "again"})
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunError, match="no evaluation runs in"):
        find_runs([tmp_path / "empty"])


def test_an_interrupted_run_leaves_no_finished_looking_folder(tmp_path: Path) -> None:
    target = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt), RunWriter(target, {"kind": "x", "label": "y"}) as w:
        w.add({"id": "1"})
        raise KeyboardInterrupt
    assert not target.exists()
    partial = tmp_path / ".run.partial"
    assert (partial / "items.jsonl").read_text().strip() == '{"id": "1"}'


# ----------------------------------------------------------------------------- judged sets
MAN_PAGE = r""".\" a comment
.TH CP 1 "2022" "GNU coreutils 9.1" "User Commands"
.SH NAME
cp \- copy files and directories
.SH SYNOPSIS
.B cp
[\fI\,OPTION\/\fR]... \fI\,SOURCE DEST\/\fR
.SH DESCRIPTION
Copy SOURCE to DEST\(em or many.
.TP
\fB\-a\fR, \fB\-\-archive\fR
same as \fB\-dR\fR
"""


def test_a_man_page_gives_its_description_and_its_text_without_it(tmp_path: Path) -> None:
    import gzip

    from ragchains.evaluation.judgedsets import read_man_page

    page = tmp_path / "cp.1.gz"
    page.write_bytes(gzip.compress(MAN_PAGE.encode()))
    # The NAME line is the query; the document is what follows it, markup read as text.
    assert read_man_page(page) == (
        "copy files and directories",
        "cp [OPTION]... SOURCE DEST Copy SOURCE to DEST— or many. -a, --archive same as -dR",
    )
    pointer = tmp_path / "cp2.1.gz"
    pointer.write_bytes(gzip.compress(b".so man1/cp.1\n"))
    assert read_man_page(pointer) is None


def test_a_judged_set_is_a_beir_folder_split_by_query_id(tmp_path: Path) -> None:
    from ragchains.evaluation.judgedsets import JudgedSet, Pair, _one_per_query, split_of

    pairs = [Pair(f"q{i}", f"query number {i}", f"d{i}") for i in range(40)]
    # A description two documents share judges neither: it is left out.
    pairs += [Pair("qa", "same words", "d0"), Pair("qb", "Same words", "d1")]
    judged = JudgedSet(
        "toy", {f"d{i}": (f"title {i}", f"text {i}") for i in range(40)}, _one_per_query(pairs)
    )
    folder = judged.write(tmp_path / "toy")
    splits = {split: load_beir(folder, split) for split in ("train", "test")}
    assert {q for d in splits.values() for q in d.queries} == {f"q{i}" for i in range(40)}
    assert all(split_of(q) == name for name, d in splits.items() for q in d.queries)
    assert 10 < len(splits["test"].queries) < 30  # about half each
    some = next(iter(splits["test"].queries))
    assert splits["test"].qrels[some] == {f"d{some[1:]}": 1.0}
    assert splits["train"].document_text(3) == "title 3\ntext 3"


def _write_fake_mtrag(root: Path) -> None:
    """The files of github.com/IBM/mt-rag-benchmark the cloud set reads, a few rows each."""

    def jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")

    def passage(doc_id: str) -> dict[str, str]:
        return {"document_id": doc_id, "title": f" Title  {doc_id} ", "text": f"text of {doc_id}\n"}

    un = root / "mtragun-human"
    jsonl(
        un / "generation_tasks/reference.jsonl",
        [
            {
                "task_id": "t1",
                "Collection": "ibmcloud",
                "contexts": [passage("c1"), passage("c2")],
                "input": [{"text": "What is a VPC?"}, {"text": "Which  is more\nimportant?"}],
            },
            # Unanswerable: no relevant passage in the qrels, so no query.
            {"task_id": "t2", "Collection": "ibmcloud", "contexts": [], "input": [{"text": "x"}]},
            {"task_id": "t3", "Collection": "fiqa", "contexts": [passage("f1")], "input": []},
        ],
    )
    qrels = un / "retrieval_tasks/qrels/cloud.tsv"
    qrels.parent.mkdir(parents=True)
    qrels.write_text("query-id\tcorpus-id\tscore\nt1\tc1\t1\nt1\tc2\t1\nt2\tc1\t0\n")
    human = root / "mtrag-human"
    subset = {
        "documents": [passage("c2"), passage("c3"), passage("c4")],
        "tasks": [
            {"task_id": "h1", "Collection": "mt-rag-ibmcloud-elser", "contexts": [passage("c3")]},
            {"task_id": "h2", "Collection": "mt-rag-ibmcloud-elser", "contexts": [passage("c4")]},
        ],
    }
    (human / "evaluations").mkdir(parents=True)
    (human / "evaluations/reference_subset_with_human_evaluations.json").write_text(
        json.dumps(subset)
    )
    jsonl(
        human / "retrieval_tasks/cloud/cloud_rewrite.jsonl",
        [{"_id": "h1", "text": "|user|: How do I create a VPC?"}],
    )
    qrels = human / "retrieval_tasks/cloud/qrels/dev.tsv"
    qrels.parent.mkdir(parents=True)
    qrels.write_text("query-id\tcorpus-id\tscore\nh1\tc3\t1\n")


def test_an_mtrag_set_keeps_every_relevant_passage_and_both_kinds_of_query(
    tmp_path: Path,
) -> None:
    from ragchains.evaluation.judgedsets import main

    _write_fake_mtrag(tmp_path / "mtrag")
    main(["mtrag-cloud", "--source", str(tmp_path / "mtrag"), "--out", str(tmp_path / "set")])
    both = [load_beir(tmp_path / "set", split) for split in ("train", "test")]
    queries = {q: text for d in both for q, text in d.queries.items()}
    qrels = {q: rel for d in both for q, rel in d.qrels.items()}
    # The follow-up as written and the human rewrite; an unanswerable turn has no query.
    assert queries == {"lt:t1": "Which is more important?", "rw:h1": "How do I create a VPC?"}
    assert qrels == {"lt:t1": {"c1": 1.0, "c2": 1.0}, "rw:h1": {"c3": 1.0}}
    corpus = (tmp_path / "set/corpus.jsonl").read_text().splitlines()
    # The domain's passages only (not FiQA's), each once, its title's spaces collapsed.
    assert sorted(json.loads(line)["_id"] for line in corpus) == ["c1", "c2", "c3", "c4"]
    assert json.loads(corpus[0])["title"] == "Title c1"


def test_an_mtrag_set_without_its_checkout_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ragchains.evaluation.judgedsets import main

    with pytest.raises(SystemExit) as exited:
        main(["mtrag-govt", "--out", str(tmp_path / "set")])
    assert exited.value.code == 2
    assert "give --source" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["mtrag-govt", "--source", str(tmp_path / "absent")])
    assert "No such file" in capsys.readouterr().err
    assert not (tmp_path / "set").exists()
