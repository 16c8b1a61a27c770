"""Requests as the server accepts them, checked before any work: the chains' input types
plus size limits and filters checked against the index (422), and the ``configurable``
choices: unknown keys and bad values 422, a domain or prompt version that does not exist 400.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal
from uuid import UUID

from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import Runnable, RunnableBinding
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictStr,
    ValidationError,
    create_model,
    field_validator,
)

from ragchains.chains.graph import AskInput, ChatInput
from ragchains.chains.options import (
    DOMAIN_KEY,
    LATEST,
    RESOLVED_KEY,
    Choices,
    Configure,
    OptionsError,
    a_number,
    explain_choice,
    problem_text,
    version_key,
)
from ragchains.chains.retrieve import MAX_ALTERNATIVES, RetrieveInput
from ragchains.chains.rewrite import RewriteInput
from ragchains.factory import Service, filterable_fields
from ragchains.prompts.registry import (
    DEFAULT_DOMAIN,
    PerLoad,
    PromptRegistry,
    PromptSelectionError,
)
from ragchains.retrievers.filters import MetadataFilter, validate_filters
from ragchains.settings import Settings
from ragchains.textrules import text_type


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

    def text(self, what: str) -> Any:
        """The type of a question-like field (a question, a query) within these limits."""
        return text_type(what, self.question_chars)

    def history(self) -> Any:
        """The type of a chat history within these limits (see ``history_type``)."""
        return history_type(self)


# ----------------------------------------------------------------------------- chat history
# A history as it arrives: each turn as LangChain serialises a message (what RemoteRunnable
# sends) or as OpenAI writes one. Only the words are kept: the metadata LangChain sends
# along (ids, kwargs, usage) says nothing a later turn reads.
_TURN_HINT = (
    "give {'type': 'human' or 'ai', 'content': text} or {'role': 'user' or 'assistant', "
    "'content': text}"
)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def history_type(limits: Limits) -> Any:
    """``chat_history``'s type: at most ``limits.history_messages`` turns, each a turn of the
    conversation whose text is plain (no control characters), at most
    ``limits.history_chars`` characters in all; validated into LangChain messages."""
    words = text_type("message", limits.history_chars, blank=True)
    no_calls: Any = Field(default_factory=list, max_length=0, description="always empty: a turn")

    # Titles end in "Message": LangServe's playground offers its chat widget (a message per
    # row, its speaker chosen from a list) for a list whose kinds are titled so.
    class Turn(BaseModel):
        model_config = ConfigDict(extra="forbid")
        content: words  # type: ignore[valid-type]
        message: ClassVar[type[BaseMessage]]  # what the turn becomes

    class LangChainTurn(Turn):
        additional_kwargs: dict[str, Any] = Field(default_factory=dict)
        response_metadata: dict[str, Any] = Field(default_factory=dict)
        name: str | None = None
        id: str | None = None

    class HumanTurn(LangChainTurn):
        """A user's turn as LangChain serialises a HumanMessage."""

        model_config = ConfigDict(title="HumanTurnMessage")
        type: Literal["human"]
        message = HumanMessage

    class AITurn(LangChainTurn):
        """The assistant's turn as LangChain serialises an AIMessage (without tool calls)."""

        model_config = ConfigDict(title="AITurnMessage")
        type: Literal["ai"]
        message = AIMessage
        tool_calls: list[dict[str, Any]] = no_calls
        invalid_tool_calls: list[dict[str, Any]] = no_calls
        usage_metadata: dict[str, Any] | None = None

    class UserTurn(Turn):
        """A user's turn as OpenAI writes it."""

        model_config = ConfigDict(title="UserTurnMessage")
        role: Literal["user"]
        message = HumanMessage

    class AssistantTurn(Turn):
        """The assistant's turn as OpenAI writes it."""

        model_config = ConfigDict(title="AssistantTurnMessage")
        role: Literal["assistant"]
        message = AIMessage

    turn: Any = HumanTurn | AITurn | UserTurn | AssistantTurn
    # Which model a turn is read as: by its ``type`` (LangChain's) or else its ``role``.
    kinds: dict[tuple[str, Any], type[BaseModel]] = {
        ("type", "human"): HumanTurn,
        ("type", "ai"): AITurn,
        ("role", "user"): UserTurn,
        ("role", "assistant"): AssistantTurn,
    }

    def one_turn(item: Any) -> BaseModel:
        if isinstance(item, BaseMessage):  # in-process callers (MCP's tools)
            item = {"type": item.type, "content": item.content}
        if not isinstance(item, dict):
            raise ValueError("not an object")
        key = "type" if "type" in item else "role"
        value = item.get(key)
        model = kinds.get((key, value)) if isinstance(value, str) else None
        if model is None:
            raise ValueError(f"{key} {_shown(value)} is not one of a turn's")
        try:
            return model.model_validate(item)
        except ValidationError as exc:
            raise ValueError(problem_text(exc.errors()[0])) from None

    def turns(value: Any) -> list[Any]:
        """Each turn checked, a problem named by its position."""
        if not isinstance(value, list):
            raise ValueError("chat_history must be a list of messages")
        if len(value) > limits.history_messages:  # before checking each of them
            raise ValueError(
                f"the chat history has {len(value)} messages; the limit is "
                f"{limits.history_messages}"
            )
        checked = []
        for n, item in enumerate(value):
            try:
                checked.append(one_turn(item))
            except ValueError as exc:
                raise ValueError(
                    f"chat_history[{n}] is not a turn of the conversation ({exc}); {_TURN_HINT}"
                ) from None
        return checked

    def as_messages(checked: list[Any]) -> list[BaseMessage]:
        chars = sum(len(t.content) for t in checked)
        if chars > limits.history_chars:
            raise ValueError(
                f"the chat history has {chars} characters; the limit is {limits.history_chars}"
            )
        return [t.message(t.content) for t in checked]

    return Annotated[
        list[turn],
        BeforeValidator(turns),
        Field(
            max_length=limits.history_messages,
            description=f"the conversation so far, oldest first; at most "
            f"{limits.history_chars} characters in all",
        ),
        AfterValidator(as_messages),
    ]


def request_models(limits: Limits, fields: Mapping[str, str]) -> dict[str, type[BaseModel]]:
    """The input model of each served runnable, by route name, for one loaded index."""
    question = limits.text("question")
    history = limits.history()

    def filters(value: list[MetadataFilter]) -> list[MetadataFilter]:
        return validate_filters(value, fields)

    class ChatRequest(ChatInput):
        model_config = ConfigDict(extra="forbid")  # a misspelt key would do nothing
        question: question  # type: ignore[valid-type]
        chat_history: history = Field(default_factory=list)  # type: ignore[valid-type]

    class AskRequest(AskInput):
        model_config = ConfigDict(extra="forbid")  # a misspelt key would do nothing
        question: question  # type: ignore[valid-type]
        _filters = field_validator("filters")(filters)

    class RewriteRequest(RewriteInput):
        model_config = ConfigDict(extra="forbid")  # a misspelt key would do nothing
        question: question  # type: ignore[valid-type]
        chat_history: history = Field(default_factory=list)  # type: ignore[valid-type]

    class RetrieveRequest(RetrieveInput):
        model_config = ConfigDict(extra="forbid")  # a misspelt key would do nothing
        query: limits.text("query")  # type: ignore[valid-type]
        alternatives: list[limits.text("alternative query")] = Field(  # type: ignore[valid-type]
            default_factory=list,
            max_length=MAX_ALTERNATIVES,
            description=RetrieveInput.model_fields["alternatives"].description,
        )
        _filters = field_validator("filters")(filters)

    return {
        "chat": ChatRequest,
        "ask": AskRequest,
        "rewrite": RewriteRequest,
        "retrieve": RetrieveRequest,
    }


def known_keys_model(chain: Runnable[Any, Any]) -> type[BaseModel]:
    """The model of a request's ``config`` holding the ``configurable`` keys ``chain``
    declares (its ``config_specs``), and no others.

    LangServe validates a request's config against ``runnable.config_schema()``, whose
    ``configurable`` ignores unknown keys: a misspelt ``domian`` would quietly answer from
    the default domain. This model refuses them, in the body's checks (``check_body``) and
    in the schema the OpenAPI document publishes; in-process callers are not affected (the
    chains ignore keys they do not read)."""
    fields = {
        spec.id: (
            spec.annotation,
            Field(spec.default, title=spec.name, description=spec.description),
        )
        for spec in chain.config_specs
    }
    configurable = create_model(  # type: ignore[call-overload]
        "Configurable", __config__=ConfigDict(extra="forbid"), **fields
    )
    return create_model(  # type: ignore[call-overload,no-any-return]
        chain.get_name("Config"), configurable=(configurable, None)
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
    """A chain as one route serves it (``runnable``: typed with the limit-checking input
    model) and the one resolver of each request's choices (``resolve``), built once."""

    def __init__(
        self,
        name: str,
        chain: Runnable[Any, Any],
        request_model: type[BaseModel],
        prompts: PromptRegistry,
    ) -> None:
        self.name = name
        self.prompts = prompts
        self.runnable = chain.with_types(input_type=request_model)
        self.request_model = request_model
        self._choices = chain_choices(chain)
        # The config model of one load of the prompts (a live registry loads its folder
        # again on edits: new domains and versions).
        self._config = PerLoad(lambda _: known_keys_model(chain))

    @property
    def _config_model(self) -> type[BaseModel]:
        return self._config.get(self.prompts)

    def config_schema(self, ref_template: str) -> dict[str, Any]:
        """The JSON Schema of a request's ``config`` as ``check_body`` checks it: the run
        options (``RunOptions``) and the ``configurable`` choices with their bounds, each
        domain allowing only its own prompts' versions (``Route.resolve`` refuses others).
        LangServe publishes the choices' bare types only (``_rename_pydantic_model``)."""
        schema = RunOptions.model_json_schema(ref_template=ref_template)
        configurable = self._config_model.model_fields["configurable"].annotation
        published = _without_optional(configurable).model_json_schema(ref_template=ref_template)
        published["allOf"] = [{"anyOf": self.domain_versions()}]
        schema["properties"]["configurable"] = published
        return schema

    def domain_versions(self) -> list[dict[str, Any]]:
        """One JSON Schema per domain: ``domain`` naming it (absent: the default domain) and
        each of the chain's prompt version keys listing the versions that domain has."""
        schemas = []
        prompts = self.prompts.current()
        for domain in sorted(prompts.domains):
            properties: dict[str, Any] = {DOMAIN_KEY: {"const": domain}}
            for name in self._choices.prompt_names:
                versions = sorted(prompts.versions(domain, name))
                properties[version_key(name)] = {"enum": [LATEST, *(f"v{v}" for v in versions)]}
            required = [DOMAIN_KEY] if domain != DEFAULT_DOMAIN else []
            schemas.append({"properties": properties, "required": required})
        return schemas

    def known_keys(self, configurable: Any) -> dict[str, Any]:
        """``configurable`` checked for its keys and their types as the chain declares them
        (not resolved); raises HTTPException 400 or 422."""
        if not isinstance(configurable, dict):
            raise HTTPException(422, "configurable must be an object")
        try:
            config = self._config_model.model_validate({"configurable": configurable})
        except ValidationError as exc:
            raise configurable_problem(self.prompts, exc.errors()) from exc
        return dict(config.model_dump()["configurable"] or {})

    def resolve(self, configurable: Any) -> dict[str, Any]:
        """A request's ``configurable``, resolved before any work: the one resolution the
        server makes of it (a body's, a share link's, /v1's, an MCP tool's). Two parts, each
        defined once elsewhere: the keys and types the chain declares (``known_keys``), then
        the chain's own ``Choices.resolve``, as its ``configure`` stage runs it (bounds, and
        whether the chosen domain has each chosen prompt version). Returns the choices with
        defaults filled in and the resolved ``Options`` under ``RESOLVED_KEY``, which the
        chain's ``configure`` stage takes instead of resolving again; raises HTTPException
        400 or 422."""
        values = self.known_keys(configurable)
        try:
            options = self._choices.resolve(values)
        except PromptSelectionError as exc:
            raise HTTPException(400, str(exc)) from exc
        except OptionsError as exc:
            raise HTTPException(422, str(exc)) from exc
        return {**values, RESOLVED_KEY: options}


def _without_optional(annotation: Any) -> type[BaseModel]:
    """The model in ``Model | None``."""
    return next(a for a in getattr(annotation, "__args__", (annotation,)) if a is not type(None))


def served_routes(
    service: Service,
    limits: Limits,
    names: Sequence[str],
    observers: Sequence[BaseCallbackHandler],
) -> dict[str, Route]:
    """The service's chains ``names`` as routes serve them (HTTP, MCP's tools): the server's
    limits on their input and ``observers`` (traces, metrics) on their runs."""
    requests = request_models(limits, filterable_fields(service.index))
    return {
        name: Route(
            name,
            # A binding of its own: with_config on the chain's binding would replace the
            # callbacks the chain carries (its StageClock) instead of adding to them.
            RunnableBinding(bound=service.chains[name], config={"callbacks": list(observers)}),
            requests[name],
            service.prompts,
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


# JSON's integers only (2.0 is one): pydantic would take "2" and true for 2 and 1.
AtLeastOne = Annotated[int, Field(ge=1), BeforeValidator(a_number)]


class RunOptions(BaseModel):
    """What a request's ``config`` may hold besides ``configurable``: the keys of LangChain's
    ``RunnableConfig`` a client sends, typed as LangChain types them (RemoteRunnable sends
    tags, metadata and recursion_limit with every call). LangServe hands only
    ``configurable`` to the run (its ``config_keys``): these are checked, not used."""

    model_config = ConfigDict(extra="forbid", title="RunOptions")

    tags: list[StrictStr] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    run_name: StrictStr | None = None
    run_id: UUID | None = None
    recursion_limit: AtLeastOne = 25
    max_concurrency: AtLeastOne | None = None


CONFIG_KEYS = frozenset({*RunOptions.model_fields, "configurable"})


def _invalid(loc: tuple[Any, ...], message: str, kind: str = "value_error") -> Exception:
    """A 422 naming where in the body the problem is, as FastAPI reports its own."""
    return RequestValidationError([{"loc": ("body", *loc), "msg": message, "type": kind}])


def check_body(
    route: Route, endpoint: str, body: Any, limits: Limits, *, resolve: bool = True
) -> list[dict[str, Any]]:
    """A LangServe request's body checked before LangServe reads it: an object with only its
    endpoint's keys, configs that are objects with known keys, and for a batch a list of
    inputs (at most ``limits.batch_inputs``, 413) each valid for the route. LangServe checks
    batch items and configs only as it runs them, answering a bad one with 500. A problem
    is a RequestValidationError (422) naming where, or the resolver's 400 or 422.

    Returns each config's ``configurable`` resolved (``Route.resolve``), in the order
    LangServe reads the configs: one per item of a list of configs, else one. With
    ``resolve`` false (a share link's request, whose configurable LangServe merges with the
    link's) the keys are checked and nothing is resolved."""
    if not isinstance(body, dict):
        raise _invalid((), "the body must be a JSON object", "dict_type")
    unknown = sorted(set(body) - BODY_KEYS[endpoint])
    if unknown:
        raise _invalid((unknown[0],), f"unknown key(s) {', '.join(map(repr, unknown))}")
    if "kwargs" in body and not isinstance(body["kwargs"], dict):
        raise _invalid(("kwargs",), "kwargs must be an object", "dict_type")
    configs = body.get("config", {})
    if endpoint == "batch" and isinstance(configs, list):
        resolved = [
            _check_config(route, config, ("config", n), resolve) for n, config in enumerate(configs)
        ]
    else:
        resolved = [_check_config(route, configs, ("config",), resolve)]
    if endpoint != "batch":
        return resolved
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
    return resolved


def _check_config(route: Route, config: Any, loc: tuple[Any, ...], resolve: bool) -> dict[str, Any]:
    """A config as sent: an object of RunnableConfig's keys whose ``configurable`` choices
    pass the route's resolver as written (LangServe's own check turns "5" into 5 first)."""
    if not isinstance(config, dict):
        raise _invalid(loc, "config must be an object", "dict_type")
    unknown = sorted(set(config) - CONFIG_KEYS)
    if unknown:
        raise _invalid((*loc, unknown[0]), f"unknown config key(s) {', '.join(map(repr, unknown))}")
    try:
        RunOptions.model_validate({k: v for k, v in config.items() if k != "configurable"})
    except ValidationError as exc:
        errors = [{**err, "loc": ("body", *loc, *err["loc"])} for err in exc.errors()]
        raise RequestValidationError(errors) from exc
    configurable = config.get("configurable") or {}
    return route.resolve(configurable) if resolve else route.known_keys(configurable)
