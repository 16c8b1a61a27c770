"""report.html of `eval compare`: one self-contained page from the report's data.

Inline CSS and inline SVG only: no script, no font, no file or address outside the page, so it
opens from a mail attachment or an offline disk as it does from the run folder. Every text
comes through ``html.escape`` (answers are model output, questions are the team's), and the
page's Content-Security-Policy allows no script at all, should anything slip through.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from ragchains.evaluation.compare import CHART_METRICS
from ragchains.evaluation.runs import format_value

# Okabe-Ito: told apart with any colour vision; cycled past eight variants.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000", "#F0E442")
METRIC_NAMES = {
    "has_citation": "cites a source",
    "citation_match": "cites the gold source",
    "answer_f1": "answer F1",
    "faithfulness": "faithfulness",
    "false_abstain_rate": "false-abstain rate ↓",
    "abstain_rate_unanswerable": "abstains when unanswerable",
    "latency_p50": "latency p50 (s)",
}
CHANGE_NAMES = {"answer": "answer", "citations": "citations", "abstention": "abstention",
                "error": "failed"}  # fmt: skip
CSS = """
:root { color-scheme: light; --muted: #555; --line: #d0d4da; --soft: #f4f6f8; }
* { box-sizing: border-box; }
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1a1a1a;
  margin: 0 auto; max-width: 1200px; padding: 24px; }
h1 { font-size: 1.6em; margin: 0 0 4px; }
h2 { font-size: 1.25em; margin: 32px 0 8px; border-bottom: 1px solid var(--line); }
h3 { font-size: 1.05em; margin: 0 0 4px; }
.sub, .meta { color: var(--muted); margin: 0 0 8px; }
table { border-collapse: collapse; margin: 8px 0; }
.scroll { overflow-x: auto; }
thead th, td code, .label { white-space: nowrap; }
th, td { border: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: var(--soft); font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.swatch { display: inline-block; width: 0.9em; height: 0.9em; border-radius: 2px;
  margin-right: 6px; vertical-align: -1px; }
.chart { max-width: 100%; height: auto; display: block; }
.notes { background: #fff6e0; border: 1px solid #e6c36a; padding: 8px 12px; }
.question { border: 1px solid var(--line); border-radius: 6px; padding: 12px; margin: 12px 0; }
.tag { display: inline-block; background: #fde2e1; color: #8a1c16; border-radius: 10px;
  padding: 0 8px; margin-right: 4px; font-size: 0.85em; }
.turns { display: grid; gap: 10px; margin-top: 8px;
  grid-template-columns: repeat(auto-fit, minmax(240px, 1fr)); }
.turn { background: var(--soft); border-radius: 4px; padding: 8px; min-width: 0; }
.turn h4 { margin: 0 0 6px; font-size: 0.95em; }
.answer { white-space: pre-wrap; overflow-wrap: anywhere; margin: 0 0 6px; }
.turn dl { display: grid; grid-template-columns: auto 1fr; gap: 2px 8px; margin: 0; }
.turn dt { color: var(--muted); }
.turn dd { margin: 0; overflow-wrap: anywhere; }
.turn .changed { font-weight: 700; }
.turn ul { margin: 0; padding-left: 18px; }
.error { color: #8a1c16; }
"""


def _e(value: Any) -> str:
    return escape("" if value is None else str(value), quote=True)


def _colour(n: int) -> str:
    return PALETTE[n % len(PALETTE)]


def _seconds(value: Any) -> str:
    return "n/a" if value is None else f"{float(value):.2f} s"


# ----------------------------------------------------------------------------- charts
def _wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken between words."""
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines or [""]


def metrics_chart(variants: Sequence[Mapping[str, Any]], metrics: Sequence[str]) -> str:
    """Grouped bars, one group per metric (0 to 1), one bar per variant."""
    width, left, right, top, plot_h = 860, 44, 12, 16, 236
    plot_w = width - left - right
    group = plot_w / max(len(metrics), 1)
    bar = min(36.0, group * 0.8 / max(len(variants), 1))
    # The legend under the axis labels, wrapped onto as many rows as the labels need.
    legend: list[tuple[float, float]] = []
    x, y = float(left), top + plot_h + 46.0
    for variant in variants:
        need = 28 + 7.5 * len(str(variant["label"]))
        if x > left and x + need > width - right:
            x, y = float(left), y + 18
        legend.append((x, y))
        x += need
    height = int(y + 12)
    labels = ", ".join(str(v["label"]) for v in variants)
    title = f"Metrics per variant ({labels}), from 0 to 1"
    parts = [
        f'<svg class="chart" id="metrics-chart" role="img" aria-label="{_e(title)}" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        'xmlns="http://www.w3.org/2000/svg" font-family="system-ui, sans-serif" font-size="12">',
        f"<title>{_e(title)}</title>",
    ]
    for tick in (0, 0.25, 0.5, 0.75, 1):
        y = top + plot_h * (1 - tick)
        parts.append(
            f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" '
            f'stroke="#d0d4da" stroke-width="1"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#555">{tick:g}</text>'
        )
    for i, metric in enumerate(metrics):
        x0 = left + i * group + (group - bar * len(variants)) / 2
        for j, variant in enumerate(variants):
            value = variant["metrics"].get(metric)
            x = x0 + j * bar
            name = f"{variant['label']}: {METRIC_NAMES.get(metric, metric)}"
            if value is None:
                parts.append(
                    f'<text x="{x + bar / 2:.1f}" y="{top + plot_h - 4:.1f}" text-anchor="middle" '
                    f'fill="#555" font-size="10">n/a<title>{_e(name)}: n/a</title></text>'
                )
                continue
            share = min(max(float(value), 0.0), 1.0)
            h = plot_h * share
            y = top + plot_h - h
            parts.append(
                f'<rect x="{x + 1:.1f}" y="{y:.1f}" width="{bar - 2:.1f}" height="{h:.1f}" '
                f'fill="{_colour(j)}"><title>{_e(name)}: {float(value):.3f}</title></rect>'
                f'<text x="{x + bar / 2:.1f}" y="{y - 3:.1f}" text-anchor="middle" '
                f'font-size="10" fill="#1a1a1a">{float(value):.2f}</text>'
            )
        cx = left + i * group + group / 2
        lines = _wrap(METRIC_NAMES.get(metric, metric), max(8, int(group / 7)))
        spans = "".join(
            f'<tspan x="{cx:.1f}" dy="{0 if n == 0 else 14}">{_e(line)}</tspan>'
            for n, line in enumerate(lines[:2])
        )
        parts.append(
            f'<text x="{cx:.1f}" y="{top + plot_h + 16}" text-anchor="middle">{spans}</text>'
        )
    for j, (variant, (x, y)) in enumerate(zip(variants, legend, strict=True)):
        parts.append(
            f'<rect x="{x:.1f}" y="{y - 10:.1f}" width="12" height="12" fill="{_colour(j)}"/>'
            f'<text x="{x + 16:.1f}" y="{y:.1f}">{_e(variant["label"])}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def latency_chart(variants: Sequence[Mapping[str, Any]]) -> str:
    """Horizontal bars: each variant's median and 90th-percentile seconds per question."""
    row, left, right, top = 40, 180, 96, 8
    width = 860
    height = top + row * len(variants) + 24
    longest = max((float(v["latency"].get("p90") or 0) for v in variants), default=0) or 1.0
    scale = (width - left - right) / longest
    title = "Latency per question, median and 90th percentile, per variant"
    parts = [
        f'<svg class="chart" id="latency-chart" role="img" aria-label="{_e(title)}" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        'xmlns="http://www.w3.org/2000/svg" font-family="system-ui, sans-serif" font-size="12">',
        f"<title>{_e(title)}</title>",
    ]
    for j, variant in enumerate(variants):
        y = top + j * row
        median, p90 = variant["latency"].get("median"), variant["latency"].get("p90")
        parts.append(
            f'<text x="{left - 8}" y="{y + 20}" text-anchor="end">{_e(variant["label"])}</text>'
        )
        if p90 is not None:
            parts.append(
                f'<rect x="{left}" y="{y + 4}" width="{float(p90) * scale:.1f}" height="24" '
                f'fill="{_colour(j)}" fill-opacity="0.35">'
                f"<title>{_e(variant['label'])}: p90 {float(p90):.2f} s</title></rect>"
                f'<text x="{left + float(p90) * scale + 4:.1f}" y="{y + 20}" fill="#555">'
                f"p90 {float(p90):.2f} s</text>"
            )
        if median is not None:
            parts.append(
                f'<rect x="{left}" y="{y + 4}" width="{float(median) * scale:.1f}" height="24" '
                f'fill="{_colour(j)}"><title>{_e(variant["label"])}: median '
                f"{float(median):.2f} s</title></rect>"
            )
    parts.append(
        f'<text x="{left}" y="{height - 4}" fill="#555">solid: median; light: 90th '
        "percentile (seconds per question)</text></svg>"
    )
    return "".join(parts)


# ----------------------------------------------------------------------------- tables
def _metrics_table(variants: Sequence[Mapping[str, Any]]) -> str:
    """A row per metric (the chart's first, then every other one), a column per variant."""
    names: list[str] = [m for m in CHART_METRICS if any(m in v["metrics"] for v in variants)]
    for variant in variants:
        names += [m for m in variant["metrics"] if m not in names]
    head = "".join(
        f'<th scope="col"><span class="swatch" style="background:{_colour(j)}"></span>'
        f"{_e(v['label'])}</th>"
        for j, v in enumerate(variants)
    )
    rows = []
    for m in names:
        cells = "".join(
            f'<td class="num" data-metric="{_e(m)}">'
            f"{_e(format_value(v['metrics'].get(m), m in v['skipped']))}</td>"
            for v in variants
        )
        shown = METRIC_NAMES.get(m, m)
        named = f"{_e(shown)} <code>{_e(m)}</code>" if shown != m else f"<code>{_e(m)}</code>"
        rows.append(f'<tr><th scope="row">{named}</th>{cells}</tr>')
    return (
        f'<div class="scroll"><table id="metrics-table"><thead><tr><th scope="col">metric</th>'
        f"{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def _variants_table(variants: Sequence[Mapping[str, Any]]) -> str:
    rows = []
    for j, v in enumerate(variants):
        prompts = v.get("prompts")
        shown = (
            ", ".join(f"{name}: {ref}" for name, ref in prompts.items())
            if prompts
            else "as the server resolves them"
        )
        choices = ", ".join(f"{k}={val}" for k, val in v["configurable"].items()) or "(none)"
        styles = ", ".join(f"{s} ({n})" for s, n in v["answer_styles"].items()) or "n/a"
        rows.append(
            f'<tr><th scope="row" class="label"><span class="swatch" '
            f'style="background:{_colour(j)}"></span>{_e(v["label"])}</th>'
            f"<td>{_e(choices)}</td><td>{_e(shown)}</td><td>{_e(styles)}</td>"
            f"<td>{_e(v['count'])}</td><td><code>{_e(v['run'])}/</code></td></tr>"
        )
    return (
        "<div class='scroll'><table id='variants-table'><thead><tr><th scope='col'>variant</th>"
        "<th scope='col'>configurable</th><th scope='col'>prompts</th>"
        "<th scope='col'>answer styles</th><th scope='col'>questions</th>"
        "<th scope='col'>run folder</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _latency_table(variants: Sequence[Mapping[str, Any]]) -> str:
    rows = "".join(
        f"<tr><th scope='row' class='label'>{_e(v['label'])}</th>"
        f"<td class='num'>{_e(_seconds(v['latency'].get('median')))}</td>"
        f"<td class='num'>{_e(_seconds(v['latency'].get('p90')))}</td>"
        f"<td class='num'>{_e(v['latency'].get('count'))}</td></tr>"
        for v in variants
    )
    return (
        "<div class='scroll'><table id='latency-table'><thead><tr><th scope='col'>variant</th>"
        "<th scope='col'>median</th><th scope='col'>p90</th>"
        "<th scope='col'>questions timed</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></div>"
    )


# ----------------------------------------------------------------------------- questions
def _turn(turn: Mapping[str, Any], changed: Sequence[str], colour: str) -> str:
    def mark(kind: str) -> str:
        return ' class="changed"' if kind in changed else ""

    if turn.get("error"):
        body = f'<p class="answer error"{mark("error")}>failed: {_e(turn["error"])}</p>'
    else:
        answer = turn.get("answer")
        body = f'<p class="answer"{mark("answer")}>{_e(answer) if answer else "(empty)"}</p>'
    cited = turn.get("citations") or []
    citations = "<ul>" + "".join(f"<li>{_e(c)}</li>" for c in cited) + "</ul>" if cited else "none"
    abstained = turn.get("abstained")
    said = "n/a" if abstained is None else ("yes" if abstained else "no")
    return (
        f'<div class="turn" style="border-top:4px solid {colour}">'
        f"<h4>{_e(turn['variant'])}</h4>{body}<dl>"
        f"<dt>citations</dt><dd{mark('citations')}>{citations}</dd>"
        f"<dt>abstained</dt><dd{mark('abstention')}>{said}</dd>"
        f"<dt>style</dt><dd>{_e(turn.get('answer_style') or 'n/a')}</dd>"
        f"<dt>latency</dt><dd>{_e(_seconds(turn.get('latency')))}</dd></dl></div>"
    )


def _question(question: Mapping[str, Any]) -> str:
    reference = question.get("reference") or {}
    expected = (
        f"expected: {_e(reference.get('answer') or '(no answer given)')}"
        + (f" [{_e(', '.join(reference['citations']))}]" if reference.get("citations") else "")
        if question.get("answerable", True)
        else "unanswerable: the documents do not answer it"
    )
    tags = "".join(f'<span class="tag">{_e(CHANGE_NAMES[k])}</span>' for k in question["changed"])
    turns = "".join(
        _turn(turn, question["changed"], _colour(j)) for j, turn in enumerate(question["turns"])
    )
    return (
        f'<article class="question" data-id="{_e(question["id"])}">'
        f"<h3>{_e(question['question'])}</h3>"
        f'<p class="meta"><code>{_e(question["id"])}</code> · {expected}</p>'
        f"<p>changed: {tags}</p>"
        f'<div class="turns">{turns}</div></article>'
    )


def _unchanged(questions: Sequence[Mapping[str, Any]]) -> str:
    if not questions:
        return "<p>Every question changed.</p>"
    items = "".join(
        f"<li><code>{_e(q['id'])}</code> {_e(q['question'])}: {_e(_said(q['turns'][0]))}</li>"
        for q in questions
    )
    return (
        f"<details><summary>Show the {len(questions)} unchanged "
        f"question{'s' if len(questions) != 1 else ''}</summary><ul>{items}</ul></details>"
    )


def _said(turn: Mapping[str, Any]) -> str:
    if turn.get("error"):
        return f"failed: {turn['error']}"
    cited = ", ".join(turn.get("citations") or []) or "no citation"
    return f"{turn.get('answer') or '(empty)'} ({cited})"


# ----------------------------------------------------------------------------- the page
def render_html(report: Mapping[str, Any]) -> str:
    """The whole page, one string."""
    variants = report["variants"]
    questions = report["questions"]
    counts = report["counts"]
    labels = " vs ".join(str(v["label"]) for v in variants)
    title = f"{report['dataset']}: {labels}"
    metrics = [m for m in CHART_METRICS if any(m in v["metrics"] for v in variants)]
    changed = [q for q in questions if q["changed"]]
    unchanged = [q for q in questions if not q["changed"]]
    kinds = ", ".join(
        f"{CHANGE_NAMES[kind]} {counts[kind]}" for kind in CHANGE_NAMES if counts.get(kind)
    )
    target = report.get("target") or {}
    described = ", ".join(
        f"{k} {target[k]}" for k in ("kind", "index", "url", "mode") if target.get(k)
    )
    notes = "".join(f"<p>{_e(note)}</p>" for note in report.get("notes") or [])
    body = [
        f"<header><h1>Prompt comparison: {_e(report['dataset'])}</h1>",
        f'<p class="sub">{_e(labels)} · {counts["questions"]} questions · '
        f"{_e(described)} · {_e(report.get('created'))}</p></header>",
        f'<section class="notes" id="notes">{notes}</section>' if notes else "",
        '<section id="variants"><h2>Variants</h2>',
        _variants_table(variants),
        "</section>",
        '<section id="metrics"><h2>Metrics</h2>',
        metrics_chart(variants, metrics),
        _metrics_table(variants),
        "</section>",
        '<section id="latency"><h2>Latency</h2>',
        latency_chart(variants),
        _latency_table(variants),
        "</section>",
        f'<section id="changed"><h2>Questions that changed ({len(changed)} of '
        f"{counts['questions']})</h2>",
        f'<p class="meta">{_e(kinds)}</p>' if kinds else "",
        "".join(_question(q) for q in changed)
        or "<p>No question changed: every variant gave the same answer, citations and "
        "abstention.</p>",
        "</section>",
        f'<section id="unchanged"><h2>Unchanged questions ({len(unchanged)})</h2>',
        _unchanged(unchanged),
        "</section>",
    ]
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; img-src data:\">"
        '<link rel="icon" href="data:,">'
        f"<title>ragchains eval compare · {_e(title)}</title>"
        f"<style>{CSS}</style></head>\n<body>\n"
        + "\n".join(p for p in body if p)
        + "\n</body></html>\n"
    )
