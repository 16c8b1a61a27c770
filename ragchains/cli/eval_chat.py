"""`ragchains eval rewrites|answers|generate`: the commands that run the chat model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from ragchains.cli.common import (
    DOMAIN_OPTION,
    DOMAINS_OPTION,
    EXIT_FAILED,
    INDEX_OPTION,
    PROMPT_VERSION_OPTION,
    build_configurable,
    chosen_prompts,
    fail,
    load_service,
    load_settings,
    model_failures_as_errors,
    rewrite_chain,
    service_chain,
)
from ragchains.cli.eval_common import (
    ANSWER_STYLE,
    ANSWERS_CONFIG,
    LIMIT,
    OUT,
    QUIET,
    print_summary,
    prompts_and_llm,
    user_errors,
)


def dataset_run(dataset_help: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """The options of a run over a JSONL dataset with the chat model: --dataset (with its
    help), --domain, --prompt-version, --out, --limit and -q."""

    def options(command: Callable[..., None]) -> Callable[..., None]:
        for option in reversed(
            [
                click.option(
                    "--dataset", required=True, type=click.Path(path_type=Path), help=dataset_help
                ),
                DOMAIN_OPTION,
                PROMPT_VERSION_OPTION,
                OUT,
                LIMIT,
                QUIET,
            ]
        ):
            command = option(command)
        return command

    return options


@click.command("rewrites")
@DOMAINS_OPTION
@dataset_run(
    "JSONL of turns: {id, history: [{utterance, response?}], raw, rewrite} "
    "(e.g. TREC CAsT's rewrites.jsonl)."
)
def rewrites_command(
    dataset: Path,
    domain: str | None,
    prompt_versions: tuple[str, ...],
    out: Path | None,
    limit: int | None,
    quiet: bool,
) -> None:
    """Token F1 and exact match of the rewrite chain's queries against gold rewrites.

    The raw utterance is scored the same way, as the baseline. Uses the configured chat
    model (by default the embedded SmolLM2).
    """
    from ragchains.evaluation.rewrites import REWRITE_FIELDS, load_turns, run_rewrites

    settings = load_settings()
    configurable = build_configurable(domain, prompt_versions, None, "rewrite")
    with user_errors():
        turns = load_turns(dataset, out=out, limit=limit)
        prompts, llm = prompts_and_llm(settings, configurable, "rewrite")
        chain = rewrite_chain(settings, llm, prompts, REWRITE_FIELDS)
        prompt = chosen_prompts(prompts, configurable, "rewrite")["rewrite"]
        # Inside, a model's failure is exit 1; the run folder's own errors stay exit 2.
        with model_failures_as_errors(), user_errors():
            path = run_rewrites(
                turns,
                chain,
                llm=llm,
                prompt=prompt,
                settings=settings,
                configurable=configurable,
                progress=not quiet,
            )
        print_summary([path])


_ANSWERS_CONFIG_HELP = """
\b
Config file (YAML; relative paths are relative to it):
  dataset: qa.jsonl          # {question, answer, citations[, answerable]} per line
  target:
    index: ../.index/samples # the chain in this process, or
    # url: http://localhost:8000/chat   (a LangServe route: /chat or /ask)
    # url: http://localhost:8000/v1     (the OpenAI-compatible API)
    mode: ask                # ask or chat (in-process target)
    domain: hr               # optional, as are prompt_version, k and answer_style
    # answer_style: quote     (auto, quote or free; --answer-style wins)
    # api_key_env: RAGCHAINS_API_KEY   (for a server that needs a key)
  judge:                     # optional: without it judged metrics are skipped
    provider: openai         # or embedded
    model: gpt-4o-mini
    base_url: http://localhost:11434/v1
    api_key_env: OPENAI_API_KEY
"""


@click.command("answers", epilog=_ANSWERS_CONFIG_HELP)
@DOMAINS_OPTION
@ANSWERS_CONFIG
@ANSWER_STYLE
@OUT
@LIMIT
@QUIET
def answers_command(
    config_file: Path,
    answer_style: str | None,
    out: Path | None,
    limit: int | None,
    quiet: bool,
) -> None:
    """Ask every ground-truth question; measure latency, length, citations, abstention.

    Per question and in summary: latency, answer_length (words), has_citation,
    citation_match (every gold citation cited), abstained, answer_f1, faithfulness (share
    of answer sentences found verbatim in a source they cite; pooled over the sentences of
    all answers that do not abstain); with a judge also groundedness, relevance and
    dontknowness (1-5).
    """
    from ragchains.evaluation.answerrun import plan_answers, run_answers
    from ragchains.evaluation.answers import TargetError

    settings = load_settings()
    with user_errors():
        plan = plan_answers(config_file, answer_style=answer_style, out=out, limit=limit)
        spec = plan.config.target
        service = graph = None
        if spec.index is not None:
            service = load_service(settings, spec.index, plan.configurable, spec.mode)
            graph = service_chain(service, spec.mode)
        try:
            answered = run_answers(plan, settings, service=service, graph=graph, progress=not quiet)
        except TargetError as exc:
            fail(str(exc), EXIT_FAILED)
    print_summary([answered.path])
    if not answered.judged:
        click.echo("judged metrics skipped: no judge in the config", err=True)


@click.command("generate")
@INDEX_OPTION
@click.option(
    "--out",
    "out_file",
    required=True,
    type=click.Path(path_type=Path),
    help="JSONL file to write (must not exist); `eval answers` reads it as its dataset.",
)
@click.option("--count", type=click.IntRange(min=0), default=20, show_default=True)
@click.option(
    "--unanswerable",
    type=click.IntRange(min=0),
    default=6,
    show_default=True,
    help="Questions the index cannot answer, split over unrelated, related-absent and nonsensical.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Chunk sampling seed.")
@QUIET
def generate_command(
    index: Path, out_file: Path, count: int, unanswerable: int, seed: int, quiet: bool
) -> None:
    """Write QA pairs from an index's chunks with the configured chat model.

    Each pair cites the chunk it was written from. Unanswerable questions (answerable:
    false) measure whether the chain says it does not know. Review the file before using it
    as ground truth: a small model writes weak questions.
    """
    from ragchains.evaluation.generate import generate_all, open_for_generation, write_questions

    if out_file.exists():
        fail(f"{out_file} already exists; choose another --out file")
    settings = load_settings()
    with user_errors():
        search_index, writer = open_for_generation(settings, index, out_file)
    with model_failures_as_errors():
        items, dropped = generate_all(
            search_index,
            writer,
            answerable=count,
            unanswerable=unanswerable,
            seed=seed,
            progress=not quiet,
        )
    for reason in dropped:
        click.echo(f"dropped {reason}", err=True)
    if not items:
        fail(f"the model wrote no usable question ({len(dropped)} dropped)", EXIT_FAILED)
    write_questions(items, out_file)
    made = sum(item.answerable for item in items)
    click.echo(
        f"wrote {made} QA pairs and {len(items) - made} unanswerable questions to {out_file} "
        f"({len(dropped)} dropped; prompts {', '.join(writer.refs().values())})"
    )


@click.command("found")
@DOMAINS_OPTION
@INDEX_OPTION
@dataset_run(
    "JSONL of questions (the `eval answers` format) with gold files or citations; "
    "follow-ups carry a conversation and a standalone rewrite."
)
def found_command(
    index: Path,
    dataset: Path,
    domain: str | None,
    prompt_versions: tuple[str, ...],
    out: Path | None,
    limit: int | None,
    quiet: bool,
) -> None:
    """Share of questions whose kept sources hold a gold file, per kind of question.

    Each question is searched as asked through the retrieve stage (what /retrieve and the
    chains keep after the compressor's cut). A follow-up is searched three ways: its raw
    words, its standalone rewrite, and as the chat chain searches it (the rewrite stage
    over the earlier questions and their reference answers, then the retrieve stage).
    Uses the configured chat model for the rewrites (by default the embedded SmolLM2).
    """
    from ragchains.evaluation.datasets import load_qa
    from ragchains.evaluation.found import evaluate_found
    from ragchains.evaluation.runs import RunWriter, llm_config, run_dir

    settings = load_settings()
    configurable = build_configurable(domain, prompt_versions, None, "chat")
    with user_errors():
        items = load_qa(dataset)[:limit]
        folder = run_dir(out, "found", dataset.stem)
        service = load_service(settings, index, configurable, "chat")
        config = {
            "kind": "found",
            "label": f"{dataset.stem}/{service.llm.name}",
            "dataset": str(dataset),
            "index": str(index),
            "questions": len(items),
            "llm": llm_config(settings, service.llm),
            "prompts": chosen_prompts(service.prompts, configurable, "chat"),
            "k": settings.k,
        }
        with model_failures_as_errors(), RunWriter(folder, config) as writer:
            metrics = evaluate_found(
                items,
                rewrite=service.chains.rewrite,
                retrieve=service.chains.retrieve,
                configurable=configurable,
                on_item=writer.add,
                progress=not quiet,
            )
            path = writer.finish(
                {
                    "count": writer.count,
                    "metrics": metrics,
                    "item_metrics": ["found", "found_raw", "found_standalone", "found_chat"],
                    "item_outputs": ["searched", "kept", "kept_chat"],
                }
            )
    print_summary([path])
