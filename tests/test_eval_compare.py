"""`ragchains eval compare`: variants parsed and planned, the report built from hand-made runs
(what changed, escaping), and the command end to end on the samples with hr's answer v1 and
v2, its report.html opened in Debian's Chromium."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from ragchains.evaluation.compare import (
    VariantError,
    VariantRun,
    build_report,
    changes,
    distinct,
    parse_variant,
    percentile,
    plan_variants,
    write_report,
)
from ragchains.evaluation.runs import load_run
from tests.browser import open_page
from tests.conftest import REPO
from tests.test_cli import run

SAMPLES_QA = REPO / "evaluation" / "qa" / "samples-qa.jsonl"
HOSTILE = '<script>alert("answer")</script><img src=x onerror=alert(1)>'


# ----------------------------------------------------------------------------- variants
@pytest.mark.parametrize(
    ("spec", "domain", "versions"),
    [
        ("hr", "hr", ()),
        ("hr:answer=v1", "hr", (("answer", "v1"),)),
        ("hr:answer=2, quote=V1", "hr", (("answer", "v2"), ("quote", "v1"))),
        (":answer=latest", None, (("answer", "latest"),)),
        ("my-team_2", "my-team_2", ()),
    ],
)
def test_variants_name_a_domain_and_prompt_versions(
    spec: str, domain: str | None, versions: tuple[tuple[str, str], ...]
) -> None:
    variant = parse_variant(spec)
    assert (variant.domain, variant.versions) == (domain, versions)


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("", "empty"),
        ("HR", "'HR' is not a domain name"),
        ("hr:", "no PROMPT=VERSION after ':'"),
        ("hr:answer", "'answer' is not PROMPT=VERSION"),
        ("hr:answer=two", "version 'two' of answer is not vN, N or latest"),
        ("hr:answer=1,answer=2", "answer is given twice"),
        ("hr/answer=1", "is not a domain name"),
    ],
)
def test_a_bad_variant_says_why_in_one_line(spec: str, reason: str) -> None:
    with pytest.raises(VariantError) as caught:
        parse_variant(spec)
    message = str(caught.value)
    assert message.startswith(f"--variant {spec!r}: ") and reason in message
    assert "give DOMAIN, DOMAIN:PROMPT=VERSION" in message and "\n" not in message


def test_planned_variants_take_the_configs_choices_and_change_only_their_own() -> None:
    base = {"domain": "hr", "k": 8, "answer_style": "free", "quote_version": "v1"}
    first, second, third = plan_variants(["hr:answer=1", ":answer=v2", "default"], base, "ask")
    assert (first.label, first.slug) == ("hr:answer=v1", "hr-answer-v1")
    assert first.configurable == {**base, "answer_version": "v1"}
    assert (second.label, second.configurable["domain"]) == ("hr:answer=v2", "hr")
    assert (third.label, third.slug, third.configurable) == (
        "default",
        "default",
        {**base, "domain": "default"},
    )
    with pytest.raises(VariantError, match="at least two"):
        plan_variants(["hr"], base, "ask")
    with pytest.raises(VariantError, match="chooses the same as 'hr:answer=v2'"):
        plan_variants(["hr:answer=v2", "hr:answer=2"], {}, "ask")
    with pytest.raises(VariantError, match=r"no prompt 'rewrite' here.*target.mode is ask"):
        plan_variants(["hr:rewrite=1", "hr"], {}, "ask")
    chat = plan_variants(["hr:rewrite=1", "hr:rewrite=3"], {}, "chat")
    assert [v.configurable for v in chat] == [
        {"rewrite_version": "v1", "domain": "hr"},
        {"rewrite_version": "v3", "domain": "hr"},
    ]


def test_two_variants_that_resolve_to_the_same_prompts_are_refused() -> None:
    latest, pinned = plan_variants(["hr", "hr:answer=v2"], {}, "ask")
    refs = {"answer": "hr/answer@v2", "quote": "hr/quote@v1"}
    with pytest.raises(VariantError, match=r"'hr:answer=v2' runs the same prompts as 'hr'"):
        distinct([latest, pinned], [refs, refs])
    distinct([latest, pinned], [refs, {**refs, "answer": "hr/answer@v1"}])
    distinct([latest, pinned], [None, None])  # a server resolves them: not known here


# ----------------------------------------------------------------------------- the report
def turn(answer: str | None, cited: list[str], abstained: bool, **extra: Any) -> dict[str, Any]:
    return {"answer": answer, "citations": cited, "abstained": abstained, **extra}


def test_what_counts_as_a_change() -> None:
    assert (
        changes([turn("25 days. [a]", ["a"], False), turn(" 25  days.\n[a]", ["a"], False)]) == []
    )
    assert changes([turn("x", ["a", "b"], False), turn("x", ["b", "a", "b"], False)]) == []
    assert changes([turn("x", ["a"], False), turn("y", ["b"], False)]) == ["answer", "citations"]
    assert changes([turn("I don't know.", [], True), turn("I don't know.", [], False)]) == [
        "abstention"
    ]
    failed = turn(None, [], False, error="timeout")
    assert changes([turn("x", ["a"], False), failed, turn("x", ["a"], False)]) == ["error"]
    assert changes([failed, failed]) == []


def item(item_id: str, answer: str | None, cited: list[str], **extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": item_id,
        "question": f"question {item_id}?",
        "answer": f"gold {item_id}",
        "citations": ["a.md#x"],
        "answerable": True,
        "answer_given": answer,
        "cited": cited,
        "abstained": False,
        "answer_style": "free",
        "latency": 1.0,
    }
    row.update(extra)
    return row


def variant_run(label: str, items: list[dict[str, Any]], **metrics: Any) -> VariantRun:
    version = label.rsplit("=", 1)[-1]
    return VariantRun(
        label=label,
        slug=label.replace(":", "-").replace("=", "-"),
        configurable={"domain": "hr", "answer_version": version},
        prompts={"answer": f"hr/answer@{version}", "quote": "hr/quote@v1"},
        summary={"count": len(items), "metrics": metrics, "skipped": ["groundedness"]},
        items=items,
    )


def small_runs() -> list[VariantRun]:
    before = [
        item("same", "25 days. [a.md#x]", ["a.md#x"], latency=1.0),
        item("worded", "25 days. [a.md#x]", ["a.md#x"], latency=2.0),
        item("hostile", "plain. [a.md#x]", ["a.md#x"], latency=3.0),
        item("failed", "x [a.md#x]", ["a.md#x"], latency=4.0),
    ]
    after = [
        item("same", "25 days.  [a.md#x]", ["a.md#x"], latency=2.0),
        item("worded", "Twenty-five days. [b.md#y]", ["b.md#y"], latency=4.0),
        item("hostile", HOSTILE, ["a.md#x"], abstained=True, latency=6.0),
        {**item("failed", None, []), "error": "the model timed out"},
    ]
    return [
        variant_run("hr:answer=v1", before, answer_f1=0.5, faithfulness=None, groundedness=None),
        variant_run("hr:answer=v2", after, answer_f1=0.25, faithfulness=1.0, groundedness=None),
    ]


def test_the_report_lists_each_question_with_what_changed_and_the_latency() -> None:
    report = build_report(small_runs(), dataset="mini-qa", target={"kind": "in-process"})
    assert report["format"] == "ragchains-compare" and report["dataset"] == "mini-qa"
    changed = {q["id"]: q["changed"] for q in report["questions"]}
    assert changed == {
        "same": [],
        "worded": ["answer", "citations"],
        "hostile": ["answer", "abstention"],
        "failed": ["error"],
    }
    assert report["counts"] == {
        "questions": 4, "changed": 3, "unchanged": 1,
        "answer": 2, "citations": 1, "abstention": 1, "error": 1,
    }  # fmt: skip
    first, second = report["variants"]
    assert first["latency"] == {"median": 2.5, "p90": pytest.approx(3.7), "count": 4}
    assert second["latency"] == {"median": 4.0, "p90": pytest.approx(5.6), "count": 3}
    assert second["prompts"]["answer"] == "hr/answer@v2" and second["answer_styles"] == {"free": 4}
    worded = report["questions"][1]
    assert worded["reference"] == {"answer": "gold worded", "citations": ["a.md#x"]}
    assert [(t["variant"], t["citations"]) for t in worded["turns"]] == [
        ("hr:answer=v1", ["a.md#x"]),
        ("hr:answer=v2", ["b.md#y"]),
    ]
    assert report["notes"] == []


def test_a_prompt_no_turn_used_is_said() -> None:
    runs = small_runs()
    for run_ in runs:
        for row in run_.items:
            row["answer_style"] = "quote"
    (note,) = build_report(runs, dataset="mini-qa")["notes"]
    assert "differ only in the answer prompt, which no turn used" in note
    assert "--answer-style free" in note


def test_the_page_escapes_every_text_and_holds_chart_table_and_changes(tmp_path: Path) -> None:
    runs = small_runs()
    runs[1].label = "hr:answer=v2<b>"
    runs[1].items[1]["question"] = "question <i>worded</i>?"  # the first run's text is shown
    runs[0].items[1]["question"] = 'question "<i>worded</i>"?'
    json_path, html_path = write_report(build_report(runs, dataset="mini<qa>"), tmp_path)
    page = html_path.read_text("utf-8")
    assert json.loads(json_path.read_text("utf-8"))["questions"][2]["turns"][1]["answer"] == HOSTILE
    for raw in ("<script", "<img", "<i>", "<b>", "<qa>"):
        assert raw not in page
    assert "&lt;script&gt;alert(&quot;answer&quot;)&lt;/script&gt;" in page
    assert "mini&lt;qa&gt;" in page and "hr:answer=v2&lt;b&gt;" in page
    assert "Content-Security-Policy" in page and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', ""
    )
    assert page.count('role="img"') == 2 and 'id="metrics-table"' in page
    assert "Questions that changed (3 of 4)" in page and "Unchanged questions (1)" in page


def test_percentile_is_linear_between_ranks() -> None:
    assert percentile([], 90) is None
    assert percentile([5.0], 90) == 5.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 90) == pytest.approx(3.7)


@pytest.mark.browser
def test_a_hostile_answer_is_shown_as_text_in_chromium(browser: Any, tmp_path: Path) -> None:
    _, html_path = write_report(build_report(small_runs(), dataset="mini-qa"), tmp_path)
    watched = open_page(browser, html_path.as_uri())
    page = watched.page
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    hostile = page.locator('article[data-id="hostile"]')
    assert HOSTILE in hostile.inner_text()
    assert page.locator("img").count() == 0 and page.locator("body script").count() == 0
    assert dialogs == []
    watched.assert_clean()
    page.close()


# ----------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory, sample_index: Path) -> Path:
    """`ragchains eval compare` as a user runs it: hr's answer v1 against v2, free style (the
    quote style writes with the quote prompt), on two answerable questions whose answers the
    two versions word differently and one no document answers (abstains without the model;
    the same for both), of four (--limit 3)."""
    work = tmp_path_factory.mktemp("compare")
    rows = {json.loads(line)["id"]: line for line in SAMPLES_QA.read_text("utf-8").splitlines()}
    picked = ["home-office", "unrelated-worldcup", "standard-plan-cost", "pto-days"]
    (work / "qa.jsonl").write_text("".join(rows[i] + "\n" for i in picked), "utf-8")
    config = work / "answers.yaml"
    config.write_text(f"dataset: qa.jsonl\ntarget: {{index: {sample_index}, mode: ask}}\n", "utf-8")
    out = work / "out"
    out.mkdir()  # an empty folder may be given
    result = run(
        "eval", "compare", "--config", config, "--variant", "hr:answer=v1",
        "--variant", "hr:answer=v2", "--answer-style", "free", "--limit", "3",
        "--out", out, "-q",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:4] == ["run", "kind", "n", "latency_p50"]
    assert lines[2].startswith("hr:answer=v1 ") and lines[3].startswith("hr:answer=v2 ")
    assert lines[-1] == f"report: {out / 'report.html'} (data: {out / 'report.json'})"
    assert "judged metrics skipped" in result.stderr
    return out


@pytest.mark.e2e
@pytest.mark.slow
def test_compare_writes_one_run_per_variant_and_the_report(compared: Path) -> None:
    assert sorted(p.name for p in compared.parent.iterdir()) == ["answers.yaml", "out", "qa.jsonl"]
    assert sorted(p.name for p in compared.iterdir()) == [
        "hr-answer-v1", "hr-answer-v2", "report.html", "report.json"
    ]  # fmt: skip
    report = json.loads((compared / "report.json").read_text("utf-8"))
    for variant, version in zip(report["variants"], ("v1", "v2"), strict=True):
        found = load_run(compared / variant["run"])  # an `eval answers` run like any other
        assert found.summary["kind"] == "answers" and found.summary["count"] == 3
        assert found.config["target"]["configurable"] == variant["configurable"] == {
            "answer_style": "free", "answer_version": version, "domain": "hr"
        }  # fmt: skip
        assert variant["prompts"] == {"answer": f"hr/answer@{version}", "quote": "hr/quote@v1"}
        assert variant["metrics"] == found.metrics and set(variant["answer_styles"]) == {"free"}
        assert variant["latency"]["count"] == 3 and variant["latency"]["median"] > 0
    questions = {q["id"]: q for q in report["questions"]}
    assert list(questions) == ["home-office", "unrelated-worldcup", "standard-plan-cost"]
    assert questions["unrelated-worldcup"]["changed"] == []  # abstains, the model not asked
    assert [t["abstained"] for t in questions["unrelated-worldcup"]["turns"]] == [True, True]
    changed = [q for q in report["questions"] if q["changed"]]
    assert changed, "hr's answer v1 and v2 gave the same answers: pick other questions"
    for question in changed:
        answers = [" ".join(str(t["answer"]).split()) for t in question["turns"]]
        assert ("answer" in question["changed"]) == (answers[0] != answers[1])
    assert report["counts"]["changed"] == len(changed)
    assert report["counts"]["unchanged"] == 3 - len(changed)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.browser
def test_the_report_opens_in_chromium_with_the_chart_and_the_changes(
    compared: Path, browser: Any
) -> None:
    report = json.loads((compared / "report.json").read_text("utf-8"))
    watched = open_page(browser, (compared / "report.html").as_uri())
    page = watched.page
    assert page.title() == "ragchains eval compare · qa: hr:answer=v1 vs hr:answer=v2"
    chart = page.get_by_role("img", name="Metrics per variant (hr:answer=v1, hr:answer=v2)")
    assert chart.is_visible()
    assert chart.evaluate("e => e.tagName") == "svg"
    bars = chart.locator("rect title")  # one per variant and metric with a value
    assert bars.count() >= 2 * 2 and "hr:answer=v2: cites a source:" in bars.all_text_contents()[1]
    assert page.get_by_role("img", name="Latency per question").is_visible()
    table = page.locator("#metrics-table")
    assert table.get_by_role("columnheader", name="hr:answer=v1").is_visible()
    changed = [q for q in report["questions"] if q["changed"]]
    heading = page.get_by_role("heading", name=f"Questions that changed ({len(changed)} of 3)")
    assert heading.is_visible()
    for question in changed:
        article = page.locator(f'#changed article[data-id="{question["id"]}"]')
        assert article.get_by_role("heading", name=question["question"]).is_visible()
        turns = article.locator(".turn")
        assert turns.count() == 2
        for n, shown in enumerate(question["turns"]):
            assert turns.nth(n).locator("h4").inner_text() == shown["variant"]
            assert " ".join(shown["answer"].split()) in " ".join(turns.nth(n).inner_text().split())
    unchanged = page.get_by_role("heading", name=f"Unchanged questions ({3 - len(changed)})")
    assert unchanged.is_visible()
    watched.assert_clean()
    page.close()


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("variants", "out_state", "message"),
    [
        (["hr:answer"], None, "error: give at least two --variant options to compare"),
        (["hr:answer", "hr"], None, "error: --variant 'hr:answer': 'answer' is not PROMPT=VERSION"),
        (["legal", "hr"], None, "error: --variant 'legal': unknown domain 'legal'"),
        (["hr:answer=v9", "hr"], None, "error: --variant 'hr:answer=v9': prompt "),
        (["hr:answer=v1", "hr"], "full", "out already exists and is not empty; choose another"),
        # A team's domains folder offers its own domains only (hr's files copied as legal).
        (["legal", "hr"], "team", "error: --variant 'hr': unknown domain 'hr'"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    tmp_path: Path, variants: list[str], out_state: str | None, message: str
) -> None:
    config = tmp_path / "answers.yaml"
    config.write_text(f"dataset: {SAMPLES_QA}\ntarget: {{index: nowhere, mode: ask}}\n", "utf-8")
    out = tmp_path / "out"
    args = [a for spec in variants for a in ("--variant", spec)]
    if out_state == "full":
        out.mkdir()
        (out / "notes.txt").write_text("mine", "utf-8")
    if out_state == "team":
        shutil.copytree(REPO / "prompts" / "hr", tmp_path / "team" / "legal")
        args += ["--domains", str(tmp_path / "team")]
    before = sorted(p.name for p in tmp_path.iterdir())
    result = run("eval", "compare", "--config", config, *args, "--out", out, "-q")
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    if out_state == "full":
        assert [p.name for p in out.iterdir()] == ["notes.txt"]
