"""What the `ragchains eval` commands share: their options, how their errors end, and how
a finished run is shown.

The commands live in eval_beir, eval_chat and eval_runs (one module per group of commands);
ragchains.cli.eval gathers them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from ragchains.cli.common import checked_prompts, fail, index_option

OUT = click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="Folder to write the run to (must not exist). Default: eval-runs/<time>-<kind>-<data>.",
)
LIMIT = click.option(
    "--limit", type=click.IntRange(min=1), help="Evaluate only the first N items (a quick look)."
)
QUIET = click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
# The answers config (`eval answers`, `eval compare`): the questions, the target, the judge.
ANSWERS_CONFIG = click.option(
    "--config",
    "config_file",
    required=True,
    type=click.Path(path_type=Path),
    help="YAML file naming the ground truth, the target and (optionally) the judge.",
)
ANSWER_STYLE = click.option(
    "--answer-style",
    type=click.Choice(["auto", "quote", "free"]),
    help="The turns' answer style (overrides target.answer_style): quote copies sentences "
    "from the sources, free generates; auto leaves it to the domain, the settings and the "
    "model.",
)


def beir_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--dataset, --split and --index of the commands that read a BEIR folder."""
    for option in reversed(
        [
            click.option(
                "--dataset",
                required=True,
                type=click.Path(path_type=Path),
                help="BEIR folder: corpus.jsonl, queries.jsonl, qrels/<split>.tsv.",
            ),
            click.option(
                "--split", default="test", show_default=True, help="Which qrels file to use."
            ),
            index_option(
                "Where to build (or find) the dataset's index. Default: a cache folder per corpus."
            ),
        ]
    ):
        command = option(command)
    return command


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Bad data, bad folders and unloadable indexes or models end in one line, exit 2."""
    from ragchains.evaluation import SetupError
    from ragchains.evaluation.datasets import DatasetError
    from ragchains.evaluation.runs import RunError

    try:
        yield
    except (DatasetError, RunError, SetupError) as exc:
        fail(str(exc))


def say(message: str) -> None:
    """Progress notes (building or reusing an index) go to stderr, beside the bars."""
    click.echo(message, err=True)


def print_summary(paths: list[Path]) -> None:
    from ragchains.evaluation.runs import load_run, summary_table

    click.echo(summary_table([load_run(p) for p in paths]))
    click.echo(f"written: {', '.join(str(p) for p in paths)}")


def prompts_and_llm(settings: Any, configurable: dict[str, Any], mode: str) -> tuple[Any, Any]:
    """The prompt files (the selection checked) and the configured chat model."""
    from ragchains.factory import build_llm

    prompts = checked_prompts(configurable, mode, settings)
    try:
        return prompts, build_llm(settings)
    except ValueError as exc:
        fail(str(exc))
