"""`ragchains eval summary|diff`: the commands that read run folders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ragchains.cli.eval_common import user_errors


@click.command("summary")
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--plot",
    type=click.Path(path_type=Path),
    help="Also draw the runs' metrics side by side into this PNG file.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summaries as JSON.")
def summary_command(runs: tuple[Path, ...], plot: Path | None, as_json: bool) -> None:
    """A table of the headline metrics of RUNS (run folders, or folders holding runs)."""
    import json

    from ragchains.evaluation.runs import find_runs, summary_table

    with user_errors():
        found = find_runs(list(runs))
    if as_json:
        payload: list[dict[str, Any]] = [{"path": str(r.path), **r.summary} for r in found]
        click.echo(json.dumps(payload, indent=2, ensure_ascii=False))
    else:
        click.echo(summary_table(found))
    if plot:
        from ragchains.evaluation.plots import plot_runs

        plot_runs(found, plot)
        click.echo(f"plot written to {plot}", err=True)


@click.command("diff")
@click.argument("before", type=click.Path(path_type=Path))
@click.argument("after", type=click.Path(path_type=Path))
@click.option("--metric", help="Sort by the change in this metric (default: the first one).")
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True)
def diff_command(before: Path, after: Path, metric: str | None, limit: int) -> None:
    """What changed per question between two runs of the same kind, biggest changes first."""
    from ragchains.evaluation.runs import compare_runs, format_value, load_pair, summary_table

    with user_errors():
        a, b = load_pair(before, after)
        click.echo(summary_table([a, b]))
        compared = compare_runs(a, b, metric)
    metric = compared.metric
    changes = compared.changes
    click.echo(
        f"\n{len(changes)} of {b.summary.get('count')} items changed"
        + (f"; {metric}: {compared.higher} higher, {compared.lower} lower" if metric else "")
    )
    if compared.only_before or compared.only_after:
        click.echo(
            f"{len(compared.only_before)} items only in {before}, "
            f"{len(compared.only_after)} only in {after}"
        )
    for change in changes[:limit]:
        click.echo(f"\n{change.id}: {change.text[:100]}")
        for name, (x, y) in change.changes.items():
            click.echo(f"  {name}: {format_value(x)} -> {format_value(y)}")
    if len(changes) > limit:
        click.echo(f"\n… {len(changes) - limit} more (--limit)")
