"""``ragchains eval ...``: the evaluation commands, gathered into one group.

Each command parses its options, calls ragchains.evaluation (which measures and writes the
run folder, see ragchains.evaluation.runs) and prints the result, or one line saying what is
wrong; the chains it measures come through ragchains.cli.common, as every command's do. The
commands live by kind in eval_beir, eval_chat, eval_compare and eval_runs, sharing eval_common.
"""

from __future__ import annotations

import click

from ragchains.cli.eval_beir import abstention_command, retrieval_command, tune_command
from ragchains.cli.eval_chat import (
    answers_command,
    found_command,
    generate_command,
    rewrites_command,
)
from ragchains.cli.eval_compare import compare_command
from ragchains.cli.eval_runs import diff_command, summary_command


@click.group("eval")
def eval_group() -> None:
    """Measure retrieval, answers, abstention and query rewriting.

    Every run writes a folder (config.json, items.jsonl, summary.json) that `eval summary`
    and `eval diff` read; `eval compare` runs `eval answers` per prompt variant and writes
    one report.
    """


for _command in (
    retrieval_command,
    tune_command,
    summary_command,
    diff_command,
    rewrites_command,
    abstention_command,
    answers_command,
    compare_command,
    generate_command,
    found_command,
):
    eval_group.add_command(_command)
