"""Answer evaluation: ask a target each ground-truth question, measure and judge the reply.

A target is the chain in this process, or a running server reached over HTTP (a LangServe
route such as /chat or /ask, or the OpenAI-compatible /v1). All three give back the same turn
shape (answer, citations, sources, abstained), so the metrics do not depend on the transport.

Judged metrics (1-5) come from any configured chat model reading versioned prompt files in
``evaluation/prompts``. With no judge they are ``None``: reported as skipped, never as 0.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import httpx
import yaml
from langchain_core.messages import AIMessage, HumanMessage
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from tqdm import tqdm

from ragchains.chains.llm import LLM
from ragchains.chains.options import problem_text
from ragchains.chains.queryguard import QueryGuard
from ragchains.evaluation import EVAL_PROMPTS
from ragchains.evaluation.datasets import DatasetError, QAItem
from ragchains.evaluation.metrics import citation_match, faithful_sentences, token_f1
from ragchains.prompts.registry import PromptRegistry

JUDGED = ("groundedness", "relevance", "dontknowness")
_SCORE = re.compile(r"[1-5]")
# Answers that hold for every question (wrong URL, key, domain or prompt version): stop.
ABORT_STATUSES = frozenset({400, 401, 403, 404})
GIVE_UP_AFTER = 3


class TargetError(ValueError):
    """The target cannot be reached or refuses every request; the message says how."""


class TurnError(Exception):
    """One question failed (a 5xx, a model timeout); the run records it and goes on."""


# The conversation before a question: (question, the target's answer) per earlier turn.
History = Sequence[tuple[str, str]]


class Target(Protocol):
    def describe(self) -> dict[str, Any]: ...

    def answer(
        self, question: str, history: History = (), domain: str | None = None
    ) -> dict[str, Any]:
        """The turn as ChatOutput fields: answer, citations, sources, abstained, ...;
        ``domain`` replaces the run's prompt domain for this question."""
        ...


def _messages(history: History) -> list[dict[str, str]]:
    return [
        {"role": role, "content": text}
        for question, answer in history
        for role, text in (("user", question), ("assistant", answer))
    ]


def _turn_input(question: str, history: History) -> dict[str, Any]:
    """A chain's input: the question, after the conversation when there is one."""
    return {"question": question, **({"chat_history": _messages(history)} if history else {})}


def _choices(configurable: dict[str, Any], domain: str | None) -> dict[str, Any]:
    return {**configurable, "domain": domain} if domain else configurable


@dataclass
class InProcessTarget:
    """The ask or chat graph of a loaded service."""

    graph: Any
    configurable: dict[str, Any]
    info: dict[str, Any]

    def describe(self) -> dict[str, Any]:
        return self.info

    def answer(
        self, question: str, history: History = (), domain: str | None = None
    ) -> dict[str, Any]:
        try:
            result: dict[str, Any] = self.graph.invoke(
                _turn_input(question, history),
                {"configurable": _choices(self.configurable, domain)},
            )
        except Exception as exc:
            raise TurnError(_model_failure(exc)) from exc
        return result


class _HttpTarget:
    def __init__(self, url: str, configurable: dict[str, Any], api_key: str | None, timeout: float):
        self.url = url.rstrip("/")
        self.configurable = configurable
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(timeout=timeout, headers=headers)

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        try:
            response = self.client.post(f"{self.url}{path}", json=body)
        except httpx.TimeoutException as exc:
            raise TurnError(f"no answer from {self.url} in time") from exc
        except httpx.TransportError as exc:
            raise TargetError(f"cannot reach {self.url}: {exc}") from exc
        if response.status_code in ABORT_STATUSES:
            raise TargetError(
                f"{self.url}{path} answered {response.status_code}: {_reason(response)}"
            )
        if response.status_code >= 400:
            raise TurnError(f"{response.status_code}: {_reason(response)}")
        return response.json()


def _reason(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(body, dict):
        detail = body.get("detail") or (body.get("error") or {}).get("message")
        if detail:
            return str(detail)
    return str(body)[:200]


class LangServeTarget(_HttpTarget):
    """A LangServe route of `ragchains serve`: POST <url>/invoke."""

    def describe(self) -> dict[str, Any]:
        return {"kind": "langserve", "url": self.url, "configurable": self.configurable}

    def answer(
        self, question: str, history: History = (), domain: str | None = None
    ) -> dict[str, Any]:
        body = {
            "input": _turn_input(question, history),
            "config": {"configurable": _choices(self.configurable, domain)},
        }
        return dict(self._post("/invoke", body)["output"])


class OpenAITarget(_HttpTarget):
    """The OpenAI-compatible API of `ragchains serve`: POST <url>/chat/completions.

    The model is the prompt domain; the turn's details come in the ``ragchains`` field.
    """

    def describe(self) -> dict[str, Any]:
        return {"kind": "openai", "url": self.url, "configurable": self.configurable}

    def answer(
        self, question: str, history: History = (), domain: str | None = None
    ) -> dict[str, Any]:
        extra = {k: v for k, v in self.configurable.items() if k != "domain"}
        body: dict[str, Any] = {
            "model": domain or self.configurable.get("domain") or "default",
            "messages": [*_messages(history), {"role": "user", "content": question}],
        }
        if extra:
            body["configurable"] = extra
        reply = self._post("/chat/completions", body)
        return {**reply.get("ragchains", {}), "answer": reply["choices"][0]["message"]["content"]}


def http_target(
    url: str, configurable: dict[str, Any], api_key: str | None, timeout: float
) -> Target:
    """/v1 (or anything ending in /v1) is the OpenAI API; any other path a LangServe route."""
    if url.rstrip("/").endswith("/v1"):
        return OpenAITarget(url, configurable, api_key, timeout)
    return LangServeTarget(url, configurable, api_key, timeout)


# ----------------------------------------------------------------------------- the judge
class Judge:
    """Scores a reply 1-5 with a chat model and one prompt file per judged metric."""

    def __init__(self, llm: LLM, *, prompt_version: int | str | None = None) -> None:
        self.llm = llm
        self.prompts = PromptRegistry(EVAL_PROMPTS, required=JUDGED)
        configurable = {"prompt_version": prompt_version} if prompt_version else {}
        self.chosen = {name: self.prompts.select(name, configurable) for name in JUDGED}

    def describe(self) -> dict[str, Any]:
        return {"llm": self.llm.name, "prompts": {n: p.ref for n, p in self.chosen.items()}}

    def score(self, name: str, variables: Mapping[str, str]) -> int | None:
        """The judge's score, or None when its reply holds no digit 1-5."""
        prompt = self.chosen[name]
        reply = self.llm.text(prompt, grammar="root ::= [1-5]").invoke(
            {name: variables[name] for name in prompt.input_variables}
        )
        found = _SCORE.search(reply)
        return int(found.group()) if found else None

    def judge(self, question: str, turn: Mapping[str, Any]) -> dict[str, int | None]:
        sources = "\n\n".join(
            f"[{s.get('label')}] {s.get('text', '')}" for s in turn.get("sources") or []
        )
        variables = {
            "question": question,
            "answer": str(turn.get("answer", "")),
            "sources": sources or "(no sources)",
        }
        return {name: self.score(name, variables) for name in JUDGED}


# ----------------------------------------------------------------------------- the run
def measure(item: QAItem, turn: Mapping[str, Any], latency: float) -> dict[str, Any]:
    """The reference-based metrics of one reply (no judge needed)."""
    answer = str(turn.get("answer", ""))
    cited = [str(c.get("label")) for c in turn.get("citations") or []]
    abstained = bool(turn.get("abstained"))
    sources: dict[str, list[str]] = {}
    for source in turn.get("sources") or []:
        sources.setdefault(str(source.get("label")), []).append(str(source.get("text") or ""))
    # An abstention states nothing from the sources: faithfulness does not apply.
    quoted = turn.get("answer_style") == "quote"
    found, sentences = (0, 0) if abstained else faithful_sentences(answer, sources, quoted=quoted)
    return {
        "latency": round(latency, 4),
        "answer_length": len(answer.split()),
        "has_citation": bool(cited),
        # Only answerable questions with gold citations can match; None = not applicable.
        "citation_match": (
            citation_match(cited, item.citations) if item.answerable and item.citations else None
        ),
        "abstained": abstained,
        "answer_f1": token_f1(answer, item.answer) if item.answerable and item.answer else None,
        "answer_sentences": sentences,
        "faithful_sentences": found,
        "faithfulness": found / sentences if sentences else None,
        "cited": cited,
        "answer_style": turn.get("answer_style"),
        # An answer that neither cites a source nor abstains must say so (``uncited``).
        "unmarked_uncited": not cited and not abstained and not turn.get("uncited"),
        # Right answers, not only matching citations: one of the expected phrases said, and
        # every item a list question asks for.
        "answer_holds": (
            not abstained and answer_holds(answer, item.expect, item.expect_all)
            if item.answerable and (item.expect or item.expect_all)
            else None
        ),
        "file_cited": (
            cites_a_file(cited, turn.get("sources") or [], item.files)
            if item.answerable and item.files
            else None
        ),
    }


def answer_holds(answer: str, expect: Sequence[str], expect_all: Sequence[str]) -> bool:
    """Whether ``answer`` says one of ``expect`` (when given) and all of ``expect_all``,
    in any case."""
    said = answer.casefold()
    return (not expect or any(p.casefold() in said for p in expect)) and all(
        p.casefold() in said for p in expect_all
    )


def cites_a_file(cited: Sequence[str], sources: Sequence[Any], files: Sequence[str]) -> bool:
    """Whether a cited source is from one of ``files`` (paths under the collection's root).

    Judged by the source's path, not its label: a label names the file alone ("index.md"),
    and a documentation set has many files of one name."""
    paths = {str(s.get("source") or "") for s in sources if str(s.get("label")) in set(cited)}
    return any(in_files(p, files) for p in paths)


def in_files(path: str, files: Sequence[str]) -> bool:
    """Whether ``path`` is one of ``files``, given from the collection's root."""
    return any(path == f or path.endswith("/" + f) for f in files)


def searched_terms(question: str, history: History, turn: Mapping[str, Any]) -> dict[str, Any]:
    """The queries a chat turn searched (its query, the phrasings fused with it, a re-query
    that passed the guard) and the numbers and names in them that the conversation never
    held (``invented``): the question, the earlier questions and the answers given."""
    searched = [str(turn.get("search_query") or ""), *map(str, turn.get("alternatives") or [])]
    requery = turn.get("requery") or {}
    if requery.get("query") and not requery.get("refused"):
        searched.append(str(requery["query"]))
    messages = [m for q, a in history for m in (HumanMessage(q), AIMessage(a))]
    guard = QueryGuard.for_turn(question, messages)
    invented = sorted({term for query in searched if query for term in guard.unsaid(query)})
    return {"searched": [q for q in searched if q], "invented": invented}


def evaluate_answers(
    items: Sequence[QAItem],
    target: Target,
    judge: Judge | None,
    *,
    on_item: Callable[[dict[str, Any]], None],
    progress: bool = True,
) -> dict[str, Any]:
    """Ask, measure and judge each question. A failed question is recorded and the run goes
    on; if the first ``GIVE_UP_AFTER`` all fail, the target is broken: TargetError."""
    rows = []
    said: dict[str, list[tuple[str, str]]] = {}  # each conversation's turns so far
    for item in tqdm(items, desc="questions", unit="question", disable=not progress):
        history = said.setdefault(item.conversation, []) if item.conversation else []
        start = time.perf_counter()
        try:
            turn = target.answer(item.question, list(history), item.domain)
            error = None
        except TurnError as exc:
            turn, error = {}, str(exc)
        latency = time.perf_counter() - start
        row: dict[str, Any] = {**item.as_dict(), "answer_given": turn.get("answer")}
        judged: dict[str, int | None] = dict.fromkeys(JUDGED)
        if error is None:
            row.update(measure(item, turn, latency))
            row.update(searched_terms(item.question, history, turn))
            if judge is not None:
                try:
                    judged = judge.judge(item.question, turn)
                except Exception as exc:
                    row["judge_error"] = _model_failure(exc)
        else:
            row["error"] = error
        row.update(judged)
        on_item(row)
        rows.append(row)
        if item.conversation:
            history.append((item.question, str(turn.get("answer") or "")))
        if len(rows) == GIVE_UP_AFTER and all("error" in r for r in rows):
            raise TargetError(f"the first {GIVE_UP_AFTER} questions failed: {error}")
    return summarize_answers(rows, judged=judge is not None)


def _model_failure(exc: Exception) -> str:
    """A chat model's failure as one line; anything else is a bug and is raised."""
    from ragchains.models.providers import explain_failure

    failure = explain_failure(exc)
    if failure is None:
        raise exc
    return failure.message


def _mean(values: Sequence[Any]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _share(rows: Sequence[Mapping[str, Any]], part: str, whole: str) -> float | None:
    """sum(part) / sum(whole) over ``rows`` (runs written before the metric lack both)."""
    total = sum(int(r.get(whole) or 0) for r in rows)
    return sum(int(r.get(part) or 0) for r in rows) / total if total else None


def summarize_answers(rows: Sequence[Mapping[str, Any]], *, judged: bool) -> dict[str, Any]:
    """Means over the questions; abstention split by answerability; faithfulness pooled over
    the sentences of every answer that does not abstain (answerable or not); judged metrics
    None (shown as "skipped") without a judge."""
    ok = [r for r in rows if "error" not in r]
    answerable = [r for r in ok if r["answerable"]]
    unanswerable = [r for r in ok if not r["answerable"]]
    metrics: dict[str, Any] = {
        "latency_p50": statistics.median(r["latency"] for r in ok) if ok else None,
        "answer_length": _mean([r["answer_length"] for r in ok]),
        "has_citation": _mean([r["has_citation"] for r in answerable]),
        "citation_match": _mean([r["citation_match"] for r in answerable]),
        "answer_holds": _mean([r.get("answer_holds") for r in answerable]),
        "file_cited": _mean([r.get("file_cited") for r in answerable]),
        "answer_f1": _mean([r["answer_f1"] for r in answerable]),
        "faithfulness": _share(ok, "faithful_sentences", "answer_sentences"),
        "false_abstain_rate": _mean([r["abstained"] for r in answerable]),
        "unmarked_uncited": sum(bool(r.get("unmarked_uncited")) for r in ok),
        "invented_terms": sum(len(r.get("invented") or []) for r in ok),
        "abstain_rate_unanswerable": _mean([r["abstained"] for r in unanswerable]),
        "errors": len(rows) - len(ok),
    }
    for name in JUDGED:
        # dontknowness matters on unanswerable questions; the others on answerable ones.
        subset = unanswerable if name == "dontknowness" else answerable
        metrics[name] = _mean([r[name] for r in subset]) if judged else None
    return metrics


# ----------------------------------------------------------------------------- the config file
class TargetConfig(BaseModel):
    """Exactly one of ``index`` (the chain in this process) and ``url`` (a running server)."""

    model_config = ConfigDict(extra="forbid")

    index: Path | None = None
    url: str | None = Field(
        None, description="http://host:8000/chat (or /ask) for LangServe, http://host:8000/v1"
    )
    mode: Literal["ask", "chat"] = "ask"
    domain: str | None = None
    prompt_version: int | str | dict[str, int | str] | None = None
    k: int | None = Field(None, ge=1)
    answer_style: Literal["auto", "quote", "free"] | None = Field(
        None, description="the turn's answer_style; unset = the target's own choice"
    )
    api_key_env: str | None = Field(None, description="variable holding the server's API key")
    timeout: float = Field(300.0, gt=0, description="seconds per question over HTTP")

    @model_validator(mode="after")
    def _one_target(self) -> TargetConfig:
        if (self.index is None) == (self.url is None):
            raise ValueError("give exactly one of target.index and target.url")
        return self

    @model_validator(mode="after")
    def _known_prompts(self) -> TargetConfig:
        self.configurable()  # a prompt the mode does not use is a config error
        return self

    def configurable(self) -> dict[str, Any]:
        """The turn's choices as the chains take them (``answer_version``, ...)."""
        from ragchains.chains.graph import PROMPTS_USED
        from ragchains.chains.options import version_choices

        chosen = {
            "domain": self.domain,
            "k": self.k,
            "answer_style": self.answer_style,
            **version_choices(self.prompt_version, PROMPTS_USED[self.mode]),
        }
        return {key: value for key, value in chosen.items() if value is not None}


class JudgeConfig(BaseModel):
    """The judge's chat model; settings not given here come from RAGCHAINS_* as usual."""

    model_config = ConfigDict(extra="forbid")

    provider: Literal["embedded", "openai"] = "embedded"
    model: str | None = Field(None, description="OpenAI model name, or a GGUF path (embedded)")
    base_url: str | None = None
    api_key_env: str | None = Field(None, description="variable holding the API key")
    prompt_version: int | str | None = None


class AnswersConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dataset: Path = Field(description="ground truth JSONL: {question, answer, citations}")
    target: TargetConfig
    judge: JudgeConfig | None = None


def load_answers_config(path: Path) -> AnswersConfig:
    """Read the YAML config; relative paths are relative to the file's folder."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise DatasetError(f"{path}: not valid YAML ({exc})") from exc
    try:
        config = AnswersConfig.model_validate(data)
    except ValidationError as exc:
        raise DatasetError(f"{path}: {problem_text(exc.errors()[0])}") from None
    folder = Path(path).parent
    config.dataset = folder / config.dataset
    if config.target.index is not None:
        config.target.index = folder / config.target.index
    return config
