"""`ragchains eval retrieval|tune|abstention`: the commands that measure on a BEIR folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ragchains.cli.common import (
    DOMAINS_OPTION,
    build_configurable,
    fail,
    load_settings,
    rewrite_chain,
)
from ragchains.cli.eval_common import (
    LIMIT,
    OUT,
    QUIET,
    beir_options,
    print_summary,
    prompts_and_llm,
    say,
    user_errors,
)
from ragchains.evaluation import RETRIEVERS


@click.command("retrieval")
@DOMAINS_OPTION
@beir_options
@click.option(
    "--retriever",
    "retrievers",
    multiple=True,
    type=click.Choice(RETRIEVERS),
    help="Retriever setting to evaluate; repeat for several. Default: bm25, dense and hybrid.",
)
@OUT
@LIMIT
@QUIET
def retrieval_command(
    dataset: Path,
    retrievers: tuple[str, ...],
    split: str,
    index: Path | None,
    out: Path | None,
    limit: int | None,
    quiet: bool,
) -> None:
    """nDCG@10, recall@10, recall@100 and MRR@10 of retrievers on a BEIR dataset.

    The corpus is indexed once (one chunk per document, title + text) and reused while it and
    the embedder stay the same. Writes one run folder per retriever under --out.
    rewrite+hybrid asks each query as the first turn of a chat: the configured chat model
    rewrites it (default domain), and the rewrite is searched as the chat graph searches it.
    """
    from ragchains.evaluation.retrieval import run_retrieval

    settings = load_settings()

    def rewrite_for(fields: dict[str, str]) -> Any:
        configurable = build_configurable(None, (), None, "rewrite")
        prompts, llm = prompts_and_llm(settings, configurable, "rewrite")
        return rewrite_chain(settings, llm, prompts, fields)

    with user_errors():
        runs = run_retrieval(
            settings,
            dataset,
            split=split,
            index=index,
            retrievers=retrievers,
            out=out,
            limit=limit,
            rewrite_chain=rewrite_for,
            progress=not quiet,
            say=say,
        )
        print_summary(runs)


@click.command("tune")
@beir_options
@click.option(
    "--tune-split",
    default="train",
    show_default=True,
    help="Which qrels file to tune on; --split is the one the results are reported on.",
)
@click.option(
    "--apply",
    "apply_to",
    type=click.Path(path_type=Path),
    help="Also write the recommendation as fusion.json into this index folder (e.g. the one "
    "`ragchains serve` answers from), where the hybrid retriever takes it as its default.",
)
@OUT
@LIMIT
@QUIET
def tune_command(
    dataset: Path,
    split: str,
    index: Path | None,
    tune_split: str,
    apply_to: Path | None,
    out: Path | None,
    limit: int | None,
    quiet: bool,
) -> None:
    """Sweep the hybrid retriever's fusion on one split; report the best on another.

    \b
    Swept: convex combination of normalised scores (zscore, tmm and minmax, alpha 0 to 1
    by 0.05)
    and reciprocal rank fusion (k 5 to 100, BM25:dense weights from 1:0 to 0:1).
    Each query's BM25 and dense lists are fetched once and fused in memory, exactly as the
    retriever fuses them. The best nDCG@10 on --tune-split is recommended, and its figures
    on --split are reported beside the setting in use and each retriever alone.

    \b
    Writes a run folder (config.json, items.jsonl: one line per setting, summary.json,
    sweep.png) holding fusion.json, the recommendation in the form an index folder takes;
    --apply puts it into an index. RAGCHAINS_FUSION* settings still override it. Prints
    the recommendation as RAGCHAINS_... lines too.
    """
    from ragchains.evaluation.tuning import env_lines, run_tune
    from ragchains.retrievers.indexformat import IndexLoadError, current_generation

    if tune_split == split:
        fail(f"--tune-split and --split are both {split!r}: tune on one split, report on another")
    settings = load_settings()
    if apply_to is not None:
        try:
            current_generation(apply_to)
        except IndexLoadError as exc:
            fail(f"--apply: {exc}")
    with user_errors():
        tuned = run_tune(
            settings,
            dataset,
            split=split,
            tune_split=tune_split,
            index=index,
            out=out,
            limit=limit,
            progress=not quiet,
            say=say,
        )
    print_summary([tuned.path])
    m = tuned.result.headline()
    click.echo(
        f"recommended (best nDCG@10 on {tune_split}): {tuned.best.describe()}: "
        f"{m[f'tuned@{tune_split}']:.3f} on {tune_split}, {m[f'tuned@{split}']:.3f} on {split}"
        f"\n  in use now: {tuned.current.describe()}: {m[f'current@{tune_split}']:.3f} and "
        f"{m[f'current@{split}']:.3f}; BM25 alone {m[f'bm25@{split}']:.3f}, dense alone "
        f"{m[f'dense@{split}']:.3f} on {split}"
    )
    plateau = tuned.result.plateau
    if plateau:
        alphas = plateau["alphas"]
        click.echo(
            f"  within {plateau['within']} of the best on {tune_split}: "
            f"{plateau['normalization']} alpha {alphas[0]:g} to {alphas[-1]:g}"
        )
    click.echo("as settings:  " + " ".join(env_lines(tuned.best)))
    if apply_to is not None:
        written = tuned.apply(apply_to)
        click.echo(f"written to {written}: the index's hybrid retriever now defaults to it")
    else:
        click.echo(
            f"as an index default: copy {tuned.path / 'fusion.json'} into the index folder "
            "(or run again with --apply INDEX)"
        )


@click.command("abstention")
@beir_options
@click.option(
    "--max-false-abstain",
    type=click.FloatRange(0, 1),
    default=0.1,
    show_default=True,
    help="Recommend the threshold that abstains most while wrongly abstaining on at most "
    "this share of answerable questions.",
)
@click.option(
    "--requery-share",
    type=click.FloatRange(0, 1),
    default=0.25,
    show_default=True,
    help="Recommend re-querying below the score that this share of answerable questions' "
    "best scores fall under (each such chat turn makes one more LLM call).",
)
@click.option("--step", type=click.FloatRange(min=1e-4), default=0.01, show_default=True)
@OUT
@LIMIT
@QUIET
def abstention_command(
    dataset: Path,
    split: str,
    index: Path | None,
    max_false_abstain: float,
    requery_share: float,
    step: float,
    out: Path | None,
    limit: int | None,
    quiet: bool,
) -> None:
    """Sweep the compressor threshold: abstain rate vs false-abstain rate. Needs no LLM.

    Each judged query is asked over the whole corpus (answerable) and with its relevant
    documents removed from the search (unanswerable). A turn abstains when no chunk scores
    at least the threshold, so the best compressor score decides. Writes sweep.png too.
    """
    from ragchains.evaluation.abstention import run_abstention

    settings = load_settings()
    with user_errors():
        swept = run_abstention(
            settings,
            dataset,
            split=split,
            index=index,
            max_false_abstain=max_false_abstain,
            requery_share=requery_share,
            step=step,
            out=out,
            limit=limit,
            progress=not quiet,
            say=say,
        )
    print_summary([swept.path])
    chosen, now, current = swept.chosen, swept.now, swept.current
    click.echo(
        f"recommended: RAGCHAINS_RERANK_THRESHOLD={chosen.threshold:g} for the {swept.scorer} "
        f"scorer: abstains on {chosen.abstain_rate:.0%} of unanswerable questions, wrongly on "
        f"{chosen.false_abstain_rate:.0%} of answerable ones (now {current:g}: "
        f"{now.abstain_rate:.0%} and {now.false_abstain_rate:.0%}). "
        f"Plot: {swept.path / 'sweep.png'}"
    )
    click.echo(
        f"recommended: RAGCHAINS_REQUERY_THRESHOLD={swept.requery_below:g}: a chat turn whose "
        f"best score is lower asks once for a better query ({requery_share:.0%} of answerable "
        "questions score lower)"
    )
