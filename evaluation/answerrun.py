"""One `eval answers` run from its config file: the target and the judge built from the
settings, every question asked, the run folder written.

Apart from ``evaluation.answers``, which asks, measures and judges any target: this module
only turns a config file and the settings into one run of it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from ragchains.evaluation import SetupError
from ragchains.evaluation.answers import (
    JUDGED,
    AnswersConfig,
    InProcessTarget,
    Judge,
    JudgeConfig,
    Target,
    evaluate_answers,
    http_target,
    load_answers_config,
)
from ragchains.evaluation.datasets import QAItem, load_qa
from ragchains.evaluation.runs import RunWriter, llm_config, run_dir
from ragchains.factory import Service, build_llm
from ragchains.settings import Settings

ITEM_METRICS = [
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
]


@dataclass
class AnswersPlan:
    """A run checked before any model loads: its config, questions and free run folder."""

    config: AnswersConfig
    items: list[QAItem]
    out: Path
    configurable: dict[str, Any]  # the turns' choices, as the target's chains take them


def plan_answers(
    config_file: Path, *, answer_style: str | None, out: Path | None, limit: int | None
) -> AnswersPlan:
    """Read the config file and its first ``limit`` questions; ``answer_style`` (unless
    None) replaces the config's target.answer_style."""
    config = load_answers_config(config_file)
    if answer_style is not None:
        config.target.answer_style = answer_style  # type: ignore[assignment]
    items = load_qa(config.dataset)[:limit]
    if config.target.index is not None and config.target.mode == "ask":
        talked = next((item for item in items if item.conversation), None)
        if talked is not None:
            raise SetupError(
                f"{config.dataset}: question {talked.id!r} is part of a conversation; "
                "conversations need target.mode: chat"
            )
    out = run_dir(out, "answers", config.dataset.stem)
    return AnswersPlan(config, items, out, config.target.configurable())


@dataclass
class AnswersRun:
    path: Path
    judged: bool  # False: the config names no judge, so the judged metrics were skipped


def run_answers(
    plan: AnswersPlan,
    settings: Settings,
    *,
    service: Service | None = None,
    graph: Any = None,
    progress: bool = True,
) -> AnswersRun:
    """Ask ``plan``'s questions of its target: ``graph``, the ask or chat chain of
    ``service`` (loaded from target.index), or else target.url; judge the replies when the
    config names a judge. TargetError when the target fails every question at the start."""
    spec = plan.config.target
    target: Target
    if service is not None:
        info = {
            "kind": "in-process",
            "index": str(spec.index),
            "mode": spec.mode,
            "configurable": plan.configurable,
            "llm": llm_config(settings, service.llm),
            "compressor": service.compressor.status(),
        }
        target = InProcessTarget(graph, plan.configurable, info)
    else:
        assert spec.url is not None  # the config holds exactly one of index and url
        key = os.environ.get(spec.api_key_env) if spec.api_key_env else None
        target = http_target(spec.url, plan.configurable, key, spec.timeout)
    judge = None
    judged: Any = "none: groundedness, relevance and dontknowness skipped"
    if plan.config.judge is not None:
        judge_settings = _judge_settings(settings, plan.config.judge)
        try:
            # The chat model already loaded in this process judges too, not a second copy.
            same = _chat_model(judge_settings) == _chat_model(settings)
            judge_llm = service.llm if service and same else build_llm(judge_settings)
            judge = Judge(judge_llm, prompt_version=plan.config.judge.prompt_version)
        except ValueError as exc:
            raise SetupError(f"judge: {exc}") from None
        judged = {**judge.describe(), **llm_config(judge_settings, judge.llm)}
    run_config = {
        "kind": "answers",
        "label": f"{plan.config.dataset.stem}/{_target_name(target.describe())}",
        "dataset": str(plan.config.dataset),
        "questions": len(plan.items),
        "target": target.describe(),
        "judge": judged,
    }
    with RunWriter(plan.out, run_config) as writer:
        metrics = evaluate_answers(plan.items, target, judge, on_item=writer.add, progress=progress)
        path = writer.finish(
            {
                "count": writer.count,
                "metrics": metrics,
                "skipped": [] if judge else list(JUDGED),
                "item_metrics": ITEM_METRICS,
                "item_outputs": ["answer_given", "cited", "answer_style", "searched", "invented"],
            }
        )
    return AnswersRun(path, judged=judge is not None)


def _target_name(described: dict[str, Any]) -> str:
    style = described.get("configurable", {}).get("answer_style", "auto")
    if described.get("kind") == "in-process":
        threshold = described["compressor"]["threshold"]
        name = f"{described['mode']}-{described['llm']['name']}-threshold-{threshold:g}"
    else:
        name = f"{described['kind']}-{described['url']}"
    return f"{name}-{style}"


def _chat_model(settings: Settings) -> dict[str, Any]:
    """The settings that decide which chat model ``build_llm`` makes."""
    return {k: v for k, v in settings.model_dump().items() if k.startswith(("llm_", "openai_"))}


def _judge_settings(settings: Settings, judge: JudgeConfig) -> Settings:
    """The run's settings with the judge's model in place of the chat model."""
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
                raise SetupError(f"judge: {judge.api_key_env} is not set")
            update["openai_api_key"] = SecretStr(key)
    return settings.model_copy(update=update)
