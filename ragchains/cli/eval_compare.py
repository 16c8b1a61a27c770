"""`ragchains eval compare`: one question set, two or more prompt variants, one report."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import click

from ragchains.cli.common import (
    DOMAINS_OPTION,
    EXIT_FAILED,
    checked_prompts,
    chosen_prompts,
    fail,
    load_service,
    load_settings,
    service_chain,
)
from ragchains.cli.eval_common import ANSWER_STYLE, ANSWERS_CONFIG, LIMIT, QUIET, user_errors

_COMPARE_HELP = """
\b
A variant (SPEC) is one of:
  DOMAIN                          hr: the domain's latest prompts
  DOMAIN:PROMPT=VERSION[,...]     hr:answer=v1  or  hr:answer=2,rewrite=v3
  :PROMPT=VERSION[,...]           the config's domain (target.domain), one version changed
Every other choice (k, answer style, the versions a variant leaves alone) is the config's;
a question's own `domain` in the dataset still wins over a variant's domain.

\b
Example: answer v1 against v2 of the hr domain on your own questions
  ragchains eval compare --config evaluation/qa/samples-answers.yaml \\
      --variant hr:answer=v1 --variant hr:answer=v2 --answer-style free --out cmp
  -> cmp/hr-answer-v1/, cmp/hr-answer-v2/ (`eval answers` runs), cmp/report.html, cmp/report.json

\b
The embedded model answers in the quote style unless told otherwise, and the quote style
writes with the quote prompt: compare `answer` versions with --answer-style free.
The config file is the one `ragchains eval answers --help` describes.
"""


@click.command("compare", epilog=_COMPARE_HELP)
@DOMAINS_OPTION
@ANSWERS_CONFIG
@click.option(
    "--variant",
    "variant_specs",
    multiple=True,
    required=True,
    metavar="SPEC",
    help="A domain and/or prompt versions to run the questions with, e.g. hr:answer=v2; "
    "at least two (see below).",
)
@ANSWER_STYLE
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="Folder for the variants' runs and the report (must not exist, or be empty). "
    "Default: eval-runs/<time>-compare-<data>.",
)
@LIMIT
@QUIET
def compare_command(
    config_file: Path,
    variant_specs: tuple[str, ...],
    answer_style: str | None,
    out: Path | None,
    limit: int | None,
    quiet: bool,
) -> None:
    """Ask one question set with each variant; write report.html and report.json.

    Each variant is an `eval answers` run of its own (OUT/<variant>/), with the same
    questions and target; the report puts their metrics and latency side by side, and every
    question whose answer, citations or abstention changed.
    """
    from ragchains.evaluation.answerrun import plan_answers, run_answers
    from ragchains.evaluation.answers import TargetError
    from ragchains.evaluation.compare import (
        CHANGE_KINDS,
        VariantError,
        VariantRun,
        build_report,
        comparison_dir,
        distinct,
        plan_variants,
        write_report,
    )
    from ragchains.evaluation.runs import Run, default_run_dir, load_run, summary_table

    settings = load_settings()
    with user_errors():
        # The runs are written into a hidden folder beside OUT, renamed to OUT when all is
        # written: an interrupted comparison never leaves a folder that looks finished.
        plan = plan_answers(config_file, answer_style=answer_style, out=None, limit=limit)
        final = comparison_dir(out or default_run_dir("compare", plan.config.dataset.stem))
        staging = final.parent / f".{final.name}.partial"
        spec = plan.config.target
        try:
            variants = plan_variants(variant_specs, plan.configurable, spec.mode)
        except VariantError as exc:
            fail(str(exc))
        prompts: list[dict[str, str] | None] = [None] * len(variants)
        if spec.index is not None:  # a server checks its own domains and versions
            registry = checked_prompts(plan.configurable, spec.mode, settings)
            for n, variant in enumerate(variants):
                try:
                    prompts[n] = chosen_prompts(registry, variant.configurable, spec.mode)
                except ValueError as exc:
                    fail(f"--variant {variant_specs[n]!r}: {exc}")
            try:
                distinct(variants, prompts)
            except VariantError as exc:
                fail(str(exc))
        # Models and the index load once: each variant differs only in the turns' configurable.
        service = graph = None
        if spec.index is not None:
            service = load_service(settings, spec.index, plan.configurable, spec.mode)
            graph = service_chain(service, spec.mode)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        runs = []
        judged = True
        for n, variant in enumerate(variants):
            if not quiet:
                click.echo(f"variant {n + 1}/{len(variants)}: {variant.label}", err=True)
            run_plan = dataclasses.replace(
                plan, out=staging / variant.slug, configurable=variant.configurable
            )
            try:
                answered = run_answers(
                    run_plan, settings, service=service, graph=graph, progress=not quiet
                )
            except TargetError as exc:
                fail(f"variant {variant.label}: {exc}", EXIT_FAILED)
            judged = answered.judged
            found = load_run(answered.path)
            runs.append(
                VariantRun(
                    label=variant.label,
                    slug=variant.slug,
                    configurable=variant.configurable,
                    prompts=prompts[n],
                    summary=found.summary,
                    items=found.items(),
                    config=found.config,
                )
            )
        target = {k: v for k, v in runs[0].config.get("target", {}).items() if k != "configurable"}
        report = build_report(runs, dataset=plan.config.dataset.stem, target=target)
        write_report(report, staging)
        if final.exists():
            final.rmdir()  # empty: checked above
        os.rename(staging, final)
    relabelled = [Run(final / r.slug, r.config, {**r.summary, "label": r.label}) for r in runs]
    click.echo(summary_table(relabelled))
    counts = report["counts"]
    kinds = ", ".join(f"{kind} {counts[kind]}" for kind in CHANGE_KINDS)
    click.echo(f"\n{counts['changed']} of {counts['questions']} questions changed ({kinds})")
    for note in report["notes"]:
        click.echo(f"note: {note}", err=True)
    if not judged:
        click.echo("judged metrics skipped: no judge in the config", err=True)
    click.echo(f"report: {final / 'report.html'} (data: {final / 'report.json'})")
