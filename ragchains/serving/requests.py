"""Requests as the server accepts them, checked before any work: the chains' input types
plus size limits and filters checked against the index (422), and the ``configurable``
choices: unknown keys and bad values 422, a domain or prompt version that does not exist 400.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.runnables import Runnable, RunnableBinding, RunnableConfig
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from ragchains.chains.graph import AskInput, ChatInput
from ragchains.chains.options import (
    Choices,
    Configure,
    OptionsError,
    explain_choice,
    problem_text,
)
from ragchains.chains.retrieve import RetrieveInput
from ragchains.chains.rewrite import RewriteInput
from ragchains.factory import Service, filterable_fields
from ragchains.prompts.registry import PromptRegistry, PromptSelectionError
from ragchains.retrievers.filters import MetadataFilter, validate_filters
from ragchains.settings import Settings

# Characters no typed text holds (tab and line breaks aside): a NUL-only question is not one.
CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


@dataclass(frozen=True)
class Limits:
    """The request limits of the settings (``max_*``)."""

    request_bytes: int
    question_chars: int
    history_messages: int
    history_chars: int
    batch_inputs: int

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(
            request_bytes=settings.max_request_bytes,
            question_chars=settings.max_question_chars,
            history_messages=settings.max_history_messages,
            history_chars=settings.max_history_chars,
            batch_inputs=settings.max_batch_inputs,
        )

    def text(self, text: str, what: str) -> str:
        if not text.strip():
            raise ValueError(f"the {what} is empty")
        if CONTROL_CHARACTERS.search(text):
            raise ValueError(f"the {what} holds control characters (such as NUL)")
        if len(text) > self.question_chars:
            raise ValueError(
                f"the {what} has {len(text)} characters; the limit is {self.question_chars}"
            )
        return text

    def history(self, history: list[Any]) -> list[Any]:
        if len(history) > self.history_messages:
            raise ValueError(
                f"the chat history has {len(history)} messages; "
                f"the limit is {self.history_messages}"
            )
        chars = sum(len(str(message.content)) for message in history)
        if chars > self.history_chars:
            raise ValueError(
                f"the chat history has {chars} characters; the limit is {self.history_chars}"
            )
        return history


def request_models(limits: Limits, fields: Mapping[str, str]) -> dict[str, type[BaseModel]]:
    """The input model of each served runnable, by route name, for one loaded index."""

    # pydantic passes a second argument to validators that take two: one argument each.
    def question(text: str) -> str:
        return limits.text(text, "question")

    def history(messages: list[Any]) -> list[Any]:
        return limits.history(messages)

    def filters(value: list[MetadataFilter]) -> list[MetadataFilter]:
        return validate_filters(value, fields)

    class ChatRequest(ChatInput):
        model_config = ConfigDict(extra="forbid")  # a misspelt key would do nothing
        _question = field_validator("question")(question)
        _history = field_validator("chat_history")(history)

    class AskRequest(AskInput):
        model_config = ConfigDict(extra="forbid")  # a misspelt key would do nothing
        _question = field_validator("question")(question)
        _filters = field_validator("filters")(filters)

    class RewriteRequest(RewriteInput):
        model_config = ConfigDict(extra="forbid")  # a misspelt key would do nothing
        _question = field_validator("question")(question)
        _history = field_validator("chat_history")(history)

    class RetrieveRequest(RetrieveInput):
        model_config = ConfigDict(extra="forbid")  # a misspelt key would do nothing
        _query = field_validator("query")(lambda text: limits.text(text, "query"))
        _alternatives = field_validator("alternatives")(
            lambda texts: [limits.text(text, "alternative query") for text in texts]
        )
        _filters = field_validator("filters")(filters)

    return {
        "chat": ChatRequest,
        "ask": AskRequest,
        "rewrite": RewriteRequest,
        "retrieve": RetrieveRequest,
    }


class KnownKeysOnly(RunnableBinding[Any, Any]):  # type: ignore[no-redef]  # pydantic plugin
    """A chain whose config schema refuses ``configurable`` keys the chain does not declare.

    Works around LangServe validating a request's config only against
    ``runnable.config_schema()`` (APIHandler builds its ``_ConfigPayload`` from it once), and
    langchain-core's ``config_schema`` ignoring unknown keys: a misspelt ``domian`` would
    quietly answer from the default domain, and a share link's would be dropped before any
    check of ours sees it. The same schema is the one the playground, /config_schema and
    the OpenAPI document show. In-process callers are not affected: the chains ignore keys
    they do not read.
    """

    def config_schema(self, *, include: Sequence[str] | None = None) -> type[BaseModel]:
        fields = {
            spec.id: (
                spec.annotation,
                Field(spec.default, title=spec.name, description=spec.description),
            )
            for spec in self.config_specs
        }
        configurable = create_model(  # type: ignore[call-overload]
            "Configurable", __config__=ConfigDict(extra="forbid"), **fields
        )
        return create_model(  # type: ignore[call-overload,no-any-return]
            self.get_name("Config"), configurable=(configurable, None)
        )


def configurable_problem(prompts: PromptRegistry, errors: Sequence[Any]) -> HTTPException:
    """The reply to a request whose ``configurable`` failed validation: 400 for a domain or
    prompt version that does not exist, 422 for an unknown key or a bad value."""
    unknown, bad = [], []
    for err in errors:
        key = str(err["loc"][1]) if len(err["loc"]) > 1 else ""
        if err["type"] == "extra_forbidden":
            unknown.append(key)
            continue
        reason = explain_choice(prompts, key, err.get("input"))
        if reason is not None:
            return HTTPException(400, reason)
        bad.append(problem_text(err, skip=1))
    if unknown:
        return HTTPException(
            422, f"unknown configurable key(s) {', '.join(map(repr, sorted(unknown)))}"
        )
    return HTTPException(422, f"invalid configurable value: {'; '.join(bad)}")


def chain_choices(chain: Runnable[Any, Any]) -> Choices:
    """The choices ``chain`` resolves: those of its ``configure`` stage, found in its graph."""
    stages = [n.data for n in chain.get_graph().nodes.values() if isinstance(n.data, Configure)]
    if len(stages) != 1:
        raise ValueError(f"{chain.get_name()} has {len(stages)} configure stages, not one")
    return stages[0].choices


class Route:
    """A chain as one route serves it (``runnable``: the limit-checking input model, unknown
    configurable keys refused) and the check of each request's choices, built once."""

    def __init__(
        self,
        name: str,
        chain: Runnable[Any, Any],
        request_model: type[BaseModel],
        prompts: PromptRegistry,
        *,
        binding: type[KnownKeysOnly] = KnownKeysOnly,
    ) -> None:
        self.name = name
        self.prompts = prompts
        self.runnable = binding(bound=chain.with_types(input_type=request_model))
        self.request_model = request_model
        self._config_model = self.runnable.config_schema(include=["configurable"])
        self._choices = chain_choices(chain)

    def check(self, configurable: Any) -> dict[str, Any]:
        """A request's ``configurable``, checked in full before any work: the one check the
        server makes of it (a body's, a share link's, /v1/chat/completions'). Two parts,
        each defined once elsewhere: the keys and types the chain declares (its config
        schema, which LangServe also validates, though only by bare types: its
        ``_rename_pydantic_model`` rebuilds the model from annotations without bounds), then
        the chain's own ``Choices.resolve``, as its ``configure`` stage runs it (bounds, and
        whether the chosen domain has each chosen prompt version). Returns the choices with
        defaults filled in; raises HTTPException 400 or 422."""
        if not isinstance(configurable, dict):
            raise HTTPException(422, "configurable must be an object")
        try:
            config = self._config_model.model_validate({"configurable": configurable})
        except ValidationError as exc:
            raise configurable_problem(self.prompts, exc.errors()) from exc
        values = dict(config.model_dump()["configurable"] or {})
        try:
            self._choices.resolve(values)
        except PromptSelectionError as exc:
            raise HTTPException(400, str(exc)) from exc
        except OptionsError as exc:
            raise HTTPException(422, str(exc)) from exc
        return values


def served_routes(
    service: Service,
    limits: Limits,
    names: Sequence[str],
    observers: Sequence[BaseCallbackHandler],
    *,
    binding: type[KnownKeysOnly] = KnownKeysOnly,
) -> dict[str, Route]:
    """The service's chains ``names`` as routes serve them (HTTP, MCP's tools): the server's
    limits on their input and ``observers`` (traces, metrics) on their runs."""
    requests = request_models(limits, filterable_fields(service.index))
    return {
        name: Route(
            name,
            service.chains[name].with_config(callbacks=list(observers)),
            requests[name],
            service.prompts,
            binding=binding,
        )
        for name in names
    }


# What each LangServe endpoint's body may hold besides its input (LangServe ignores other
# keys, so a misspelt one would quietly do nothing).
_EVENT_FILTERS = frozenset(
    f"{way}_{what}" for way in ("include", "exclude") for what in ("names", "types", "tags")
)
BODY_KEYS: dict[str, frozenset[str]] = {
    "invoke": frozenset({"input", "config", "kwargs"}),
    "stream": frozenset({"input", "config", "kwargs"}),
    "batch": frozenset({"inputs", "config", "kwargs"}),
    "stream_log": frozenset({"input", "config", "kwargs", "diff"}) | _EVENT_FILTERS,
    "stream_events": frozenset({"input", "config", "kwargs"}) | _EVENT_FILTERS,
}
CONFIG_KEYS = frozenset(RunnableConfig.__annotations__)


def _invalid(loc: tuple[Any, ...], message: str, kind: str = "value_error") -> Exception:
    """A 422 naming where in the body the problem is, as FastAPI reports its own."""
    return RequestValidationError([{"loc": ("body", *loc), "msg": message, "type": kind}])


def check_body(route: Route, endpoint: str, body: Any, limits: Limits) -> None:
    """A LangServe request's body checked before LangServe reads it: an object with only its
    endpoint's keys, configs that are objects with known keys, and for a batch a list of
    inputs (at most ``limits.batch_inputs``, 413) each valid for the route. LangServe checks
    batch items and configs only as it runs them, answering a bad one with 500. A problem
    is a RequestValidationError (422) naming where."""
    if not isinstance(body, dict):
        raise _invalid((), "the body must be a JSON object", "dict_type")
    unknown = sorted(set(body) - BODY_KEYS[endpoint])
    if unknown:
        raise _invalid((unknown[0],), f"unknown key(s) {', '.join(map(repr, unknown))}")
    if "kwargs" in body and not isinstance(body["kwargs"], dict):
        raise _invalid(("kwargs",), "kwargs must be an object", "dict_type")
    configs = body.get("config", {})
    if endpoint == "batch" and isinstance(configs, list):
        for n, config in enumerate(configs):
            _check_config(route, config, ("config", n))
    else:
        _check_config(route, configs, ("config",))
    if endpoint != "batch":
        return
    inputs = body.get("inputs")
    if not isinstance(inputs, list):
        raise _invalid(("inputs",), "inputs must be a list of inputs", "list_type")
    if len(inputs) > limits.batch_inputs:
        raise HTTPException(
            413, f"a batch holds {len(inputs)} inputs; the limit is {limits.batch_inputs}"
        )
    if isinstance(configs, list) and len(configs) != len(inputs):
        raise _invalid(("config",), "a list of configs needs one config per input")
    for n, item in enumerate(inputs):
        try:
            route.request_model.model_validate(item)
        except ValidationError as exc:
            errors = [{**err, "loc": ("body", "inputs", n, *err["loc"])} for err in exc.errors()]
            raise RequestValidationError(errors) from exc


def _check_config(route: Route, config: Any, loc: tuple[Any, ...]) -> None:
    """A config as sent: an object of RunnableConfig's keys whose ``configurable`` choices
    pass the route's check as written (LangServe's own check turns "5" into 5 first)."""
    if not isinstance(config, dict):
        raise _invalid(loc, "config must be an object", "dict_type")
    unknown = sorted(set(config) - CONFIG_KEYS)
    if unknown:
        raise _invalid((*loc, unknown[0]), f"unknown config key(s) {', '.join(map(repr, unknown))}")
    if "configurable" in config:
        route.check(config["configurable"])
