"""`eval compare`: one question set asked with two or more prompt variants, side by side.

A variant names a prompt domain and/or prompt versions (``hr:answer=v2``). Each variant is an
ordinary `eval answers` run (``evaluation.answerrun``: same questions, same target, the
variant's choices in the turns' ``configurable``), written to ``<out>/<slug>/``; this module
plans the variants and reads their finished runs into one report (``report.json``; the HTML
page is ``evaluation.compare_report``). It asks nothing itself.

What counts as changed, per question, across the variants:

- ``answer``: the answer text (whitespace collapsed);
- ``citations``: which sources are cited (the set of labels, order aside);
- ``abstention``: whether the turn abstained;
- ``error``: a question that failed with some variants and not with others (the others'
  fields are compared among the variants that answered).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ragchains.evaluation.runs import RunError
from ragchains.prompts.registry import DOMAIN_NAME

REPORT_FORMAT = "ragchains-compare"
REPORT_VERSION = 1
REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
CHANGE_KINDS = ("answer", "citations", "abstention", "error")
# The metrics drawn as bars: rates in [0, 1]. The table shows these and every other one.
CHART_METRICS = (
    "has_citation",
    "citation_match",
    "answer_f1",
    "faithfulness",
    "false_abstain_rate",
    "abstain_rate_unanswerable",
)
# Which prompt writes an answer of each style (chains.answer): the quote style copies
# sentences under the ``quote`` prompt, the free style generates with ``answer``.
STYLE_PROMPT = {"quote": "quote", "free": "answer"}
VARIANT_SYNTAX = "DOMAIN, DOMAIN:PROMPT=VERSION[,PROMPT=VERSION...] or :PROMPT=VERSION"

_VERSION = re.compile(r"^(?:[vV]?\d+|latest)$")


class VariantError(ValueError):
    """A --variant that cannot be read or planned; the message says which and why."""


@dataclass(frozen=True)
class Variant:
    """One variant as given: a domain (None: the config's) and prompt versions ("v2")."""

    spec: str
    domain: str | None
    versions: tuple[tuple[str, str], ...] = ()


def parse_variant(spec: str) -> Variant:
    """``hr``, ``hr:answer=v2``, ``hr:answer=1,rewrite=3`` or ``:answer=v2`` (the config's
    domain). A version is ``vN``, ``N`` or ``latest``."""
    from ragchains.chains.options import version_text

    def bad(reason: str) -> VariantError:
        return VariantError(f"--variant {spec!r}: {reason}; give {VARIANT_SYNTAX}")

    domain, colon, rest = spec.strip().partition(":")
    if not domain and not colon:
        raise bad("empty")
    if domain and not DOMAIN_NAME.match(domain):
        raise bad(f"{domain!r} is not a domain name (lowercase letters, digits, - and _)")
    versions: dict[str, str] = {}
    if colon:
        if not rest.strip():
            raise bad("no PROMPT=VERSION after ':'")
        for pair in rest.split(","):
            name, eq, version = (part.strip() for part in pair.partition("="))
            if not eq or not DOMAIN_NAME.match(name):
                raise bad(f"{pair.strip()!r} is not PROMPT=VERSION (e.g. answer=v2)")
            if not _VERSION.match(version):
                raise bad(f"version {version!r} of {name} is not vN, N or latest")
            if name in versions:
                raise bad(f"{name} is given twice")
            versions[name] = version_text(version)
    return Variant(spec, domain or None, tuple(versions.items()))


@dataclass
class PlannedVariant:
    """A variant ready to run: its label, its run folder's name and the turns' choices."""

    label: str  # "hr:answer=v2" (the domain filled in from the config, else "default")
    slug: str  # "hr-answer-v2": the run's folder under the comparison's
    configurable: dict[str, Any]


def plan_variants(specs: Sequence[str], base: Mapping[str, Any], mode: str) -> list[PlannedVariant]:
    """The variants' configurables: the config's own (``base``) with each variant's domain
    and prompt versions in place. VariantError for fewer than two variants, bad syntax, a
    prompt the mode does not use, or two variants that choose the same."""
    from ragchains.chains.graph import PROMPTS_USED
    from ragchains.chains.options import OptionsError, version_choices

    if len(specs) < 2:
        raise VariantError("give at least two --variant options to compare")
    planned: list[PlannedVariant] = []
    for spec in specs:
        variant = parse_variant(spec)
        try:
            chosen = version_choices(dict(variant.versions), PROMPTS_USED[mode])
        except OptionsError as exc:
            raise VariantError(f"--variant {spec!r}: {exc} (target.mode is {mode})") from None
        configurable = {**base, **chosen}
        if variant.domain:
            configurable["domain"] = variant.domain
        domain = str(configurable.get("domain") or "default")
        pairs = ",".join(f"{name}={version}" for name, version in variant.versions)
        label = f"{domain}:{pairs}" if pairs else domain
        twin = next((p for p in planned if p.configurable == configurable), None)
        if twin is not None:
            raise VariantError(f"--variant {spec!r} chooses the same as {twin.label!r}")
        slug = re.sub(r"[^a-z0-9_-]+", "-", label.lower()).strip("-")
        taken = {p.slug for p in planned}
        unique, n = slug, 2
        while unique in taken:
            unique, n = f"{slug}-{n}", n + 1
        planned.append(PlannedVariant(label, unique, configurable))
    return planned


def distinct(
    variants: Sequence[PlannedVariant], prompts: Sequence[Mapping[str, str] | None]
) -> None:
    """VariantError when two variants would run the same turns: the same domain, the same
    prompt files (refs, one per variant, as the registry resolves them) and the same other
    choices. Two domains are never the same turns, whatever prompts they share: each has
    its own documents, glossary and cuts."""

    def others(configurable: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in configurable.items() if not k.endswith("_version")}

    for b, later in enumerate(variants):
        for a in range(b):
            earlier = variants[a]
            if prompts[a] is None or prompts[a] != prompts[b]:
                continue
            if others(earlier.configurable) == others(later.configurable):
                refs = ", ".join(sorted((prompts[a] or {}).values()))
                raise VariantError(
                    f"--variant {later.label!r} runs the same prompts as {earlier.label!r} ({refs})"
                )


def comparison_dir(out: Path) -> Path:
    """``out``, checked before any slow work: it may not exist yet, or be an empty folder."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise RunError(f"{out} already exists and is not empty; choose another --out folder")
    return out


# ----------------------------------------------------------------------------- the report
@dataclass
class VariantRun:
    """One variant's finished run, as the report reads it."""

    label: str
    slug: str
    configurable: dict[str, Any]
    prompts: dict[str, str] | None  # refs by prompt name; None when a server resolved them
    summary: dict[str, Any]  # the run's summary.json
    items: list[dict[str, Any]]  # the run's items.jsonl
    config: dict[str, Any] = field(default_factory=dict)  # the run's config.json


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100), linear between the closest ranks; None if empty."""
    ordered = sorted(values)
    if not ordered:
        return None
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _latency(items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    seconds = [float(i["latency"]) for i in items if "error" not in i and "latency" in i]
    return {
        "median": statistics.median(seconds) if seconds else None,
        "p90": percentile(seconds, 90),
        "count": len(seconds),
    }


def _turn(item: Mapping[str, Any] | None) -> dict[str, Any]:
    """What the report shows of one variant's reply to one question."""
    if item is None:
        return {
            "answer": None,
            "citations": [],
            "abstained": None,
            "answer_style": None,
            "latency": None,
            "error": "not asked in this run",
        }
    return {
        "answer": item.get("answer_given"),
        "citations": list(item.get("cited") or []),
        "abstained": item.get("abstained"),
        "answer_style": item.get("answer_style"),
        "latency": item.get("latency"),
        "error": item.get("error"),
    }


def _differs(values: Sequence[Any]) -> bool:
    return len({repr(v) for v in values}) > 1


def changes(turns: Sequence[Mapping[str, Any]]) -> list[str]:
    """Which of CHANGE_KINDS differ across one question's turns (one per variant)."""
    answered = [t for t in turns if not t.get("error")]
    found = []
    if _differs([" ".join(str(t.get("answer") or "").split()) for t in answered]):
        found.append("answer")
    if _differs([sorted(set(t.get("citations") or [])) for t in answered]):
        found.append("citations")
    if _differs([bool(t.get("abstained")) for t in answered]):
        found.append("abstention")
    if 0 < len(answered) < len(turns):
        found.append("error")
    return found


def _notes(runs: Sequence[VariantRun]) -> list[str]:
    """What a reader must know to read the comparison right (a prompt that never ran)."""
    notes = []
    keys = {k for r in runs for k in r.configurable}
    differing = {k for k in keys if _differs([r.configurable.get(k) for r in runs])}
    prompts = {k.removesuffix("_version") for k in differing if k.endswith("_version")}
    styles = {str(i.get("answer_style")) for r in runs for i in r.items if i.get("answer_style")}
    used = {STYLE_PROMPT[s] for s in styles if s in STYLE_PROMPT}
    if (
        prompts
        and differing == {f"{p}_version" for p in prompts}
        and prompts <= set(STYLE_PROMPT.values())
        and styles
        and not prompts & used
    ):
        names = ", ".join(sorted(prompts))
        style = ", ".join(sorted(styles))
        notes.append(
            f"The variants differ only in the {names} prompt, which no turn used: every turn "
            f"answered in the {style} style, which writes with the "
            f"{', '.join(sorted(used))} prompt. Compare them with --answer-style "
            f"{'free' if 'answer' in prompts else 'quote'}."
        )
    return notes


def build_report(
    runs: Sequence[VariantRun], *, dataset: str, target: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The comparison as plain data (what report.json holds and report.html shows): per
    variant its choices, prompts, summary metrics and latency; per question (in the first
    run's order) every variant's turn and what changed."""
    if len(runs) < 2:
        raise ValueError("a comparison needs at least two runs")
    by_id = [{str(i["id"]): i for i in run.items} for run in runs]
    order = list(dict.fromkeys(str(i["id"]) for run in runs for i in run.items))
    questions = []
    for item_id in order:
        first = next(found[item_id] for found in by_id if item_id in found)
        turns = [
            {"variant": run.label, **_turn(found.get(item_id))}
            for run, found in zip(runs, by_id, strict=True)
        ]
        questions.append(
            {
                "id": item_id,
                "question": first.get("question"),
                "answerable": first.get("answerable", True),
                "reference": {
                    "answer": first.get("answer"),
                    "citations": list(first.get("citations") or []),
                },
                "changed": changes(turns),
                "turns": turns,
            }
        )
    changed = sum(1 for q in questions if q["changed"])
    variants = []
    for run in runs:
        styles: dict[str, int] = {}
        for item in run.items:
            if item.get("answer_style"):
                styles[str(item["answer_style"])] = styles.get(str(item["answer_style"]), 0) + 1
        variants.append(
            {
                "label": run.label,
                "run": run.slug,
                "configurable": run.configurable,
                "prompts": run.prompts,
                "answer_styles": styles,
                "count": run.summary.get("count", len(run.items)),
                "metrics": dict(run.summary.get("metrics") or {}),
                "skipped": list(run.summary.get("skipped") or []),
                "latency": _latency(run.items),
            }
        )
    return {
        "format": REPORT_FORMAT,
        "format_version": REPORT_VERSION,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "dataset": dataset,
        "target": dict(target or {}),
        "variants": variants,
        "counts": {
            "questions": len(questions),
            "changed": changed,
            "unchanged": len(questions) - changed,
            **{kind: sum(kind in q["changed"] for q in questions) for kind in CHANGE_KINDS},
        },
        "questions": questions,
        "notes": _notes(runs),
    }


def write_report(report: Mapping[str, Any], folder: Path) -> tuple[Path, Path]:
    """report.json and report.html in ``folder``."""
    import json

    from ragchains.evaluation.compare_report import render_html

    json_path, html_path = folder / REPORT_JSON, folder / REPORT_HTML
    text = json.dumps(report, ensure_ascii=False, indent=2, allow_nan=False, default=str)
    json_path.write_text(text + "\n", "utf-8")
    html_path.write_text(render_html(report), "utf-8")
    return json_path, html_path
