"""PNG plots of evaluation results (matplotlib, drawn to files only)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ragchains.evaluation.abstention import SweepPoint
    from ragchains.evaluation.runs import Run
    from ragchains.evaluation.tuning import TuneResult


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    return plt


def plot_sweep(
    points: Sequence[SweepPoint], chosen: SweepPoint, current: float, path: Path, title: str
) -> None:
    plt = _pyplot()
    xs = [p.threshold for p in points]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    ax.plot(xs, [p.abstain_rate for p in points], label="abstain rate (unanswerable)")
    ax.plot(xs, [p.false_abstain_rate for p in points], label="false-abstain rate (answerable)")
    ax.axvline(
        chosen.threshold,
        color="green",
        linestyle="--",
        label=f"recommended {chosen.threshold:g}",
    )
    ax.axvline(current, color="grey", linestyle=":", label=f"current default {current:g}")
    ax.set_xlabel("compressor threshold (abstain when the best score is below it)")
    ax.set_ylabel("rate")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="center right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_fusion_sweep(result: TuneResult, path: Path, title: str) -> None:
    """nDCG@10 against the dense side's share: convex (per normalisation) over alpha, RRF
    (per k) over dense_weight / (bm25_weight + dense_weight); solid on the tuning split,
    dashed on the report split; each retriever alone as a dotted line."""
    from ragchains.evaluation.tuning import HEADLINE

    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), dpi=120, sharey=True)
    panels = {"convex": axes[0], "rrf": axes[1]}
    curves: dict[tuple[str, str], list[tuple[float, Any]]] = {}
    for point in result.points:
        c = point.config
        key: tuple[str, str]
        if c.fusion == "convex":
            key, x = ("convex", c.normalization), c.alpha
        else:
            key, x = ("rrf", f"k={c.rrf_k}"), c.dense_weight / (c.bm25_weight + c.dense_weight)
        curves.setdefault(key, []).append((x, point))
    for n, ((method, name), found) in enumerate(sorted(curves.items())):
        found.sort(key=lambda xp: xp[0])
        xs = [x for x, _ in found]
        color = f"C{n % 10}"
        ax = panels[method]
        for split, style in ((result.tune, "-"), (result.report, "--")):
            ys = [p.metrics[split][HEADLINE] for _, p in found]
            ax.plot(xs, ys, style, color=color, label=f"{name} ({split})", linewidth=1.2)
    for ax, method in ((axes[0], "convex"), (axes[1], "rrf")):
        for side, color in (("bm25", "grey"), ("dense", "black")):
            ax.axhline(
                result.sides[side][result.report][HEADLINE],
                color=color,
                linestyle=":",
                linewidth=1,
                label=f"{side} alone ({result.report})",
            )
        for point, marker, label in ((result.current, "o", "in use"), (result.best, "*", "tuned")):
            c = point.config
            if c.fusion != method:
                continue
            x = c.alpha if method == "convex" else c.dense_weight / (c.bm25_weight + c.dense_weight)
            ax.plot(
                x,
                point.metrics[result.tune][HEADLINE],
                marker,
                color="red",
                markersize=9 if marker == "*" else 6,
                label=f"{label}: {c.describe()}",
            )
        ax.set_xlabel(
            "alpha (dense weight)" if method == "convex" else "dense_weight / (sum of weights)"
        )
        ax.set_title(f"{method}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="lower center", ncol=2)
    axes[0].set_ylabel(HEADLINE)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_runs(runs: Sequence[Run], path: Path) -> None:
    """One panel per kind of run: bars per run for each metric on a 0-1 scale (rates,
    recall, nDCG, F1). Latencies and 1-5 judge scores stay in the table."""
    from ragchains.evaluation.runs import by_kind

    groups = list(by_kind(runs).values())
    plt = _pyplot()
    fig, axes = plt.subplots(len(groups), 1, figsize=(9, 3.8 * len(groups)), squeeze=False)
    for ax, group in zip(axes[:, 0], groups, strict=True):
        shown = _unit_metrics(group)
        width = 0.8 / len(group)
        for i, run in enumerate(group):
            values = [run.metrics.get(n) or 0.0 for n in shown]
            xs = [j + (i - (len(group) - 1) / 2) * width for j in range(len(shown))]
            bars = ax.bar(xs, values, width, label=run.label)
            ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=1)
        ax.set_xticks(range(len(shown)), shown, rotation=25, ha="right", fontsize=8)
        ax.set_ylim(0, 1.12)
        ax.set_title(str(group[0].summary.get("kind", "")), fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _unit_metrics(runs: Sequence[Run]) -> list[str]:
    names: list[str] = []
    for run in runs:
        names += [n for n in run.metrics if n not in names]

    def unit(value: Any) -> bool:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        return number and 0.0 <= value <= 1.0

    return [
        n
        for n in names
        if any(r.metrics.get(n) is not None for r in runs)
        and all(unit(r.metrics[n]) for r in runs if r.metrics.get(n) is not None)
        and "threshold" not in n
    ]
