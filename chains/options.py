"""What a request may choose through ``config["configurable"]``, declared and resolved once.

A chain declares the choices it reads as LangChain ``ConfigurableFieldSpec``s with concrete
types: the domain and each prompt's version are enumerations built from the prompt registry,
``k`` and ``threshold`` plain numbers with the parts' own defaults. LangServe validates a
request against them and its playground renders them as lists and fields (an ``Optional``,
``anyOf`` with null, would leave the playground blank).

A chain that answers also offers ``answer_style``: ``quote`` (sentences copied from the
sources under a grammar), ``free`` (free generation) or ``auto`` (no choice here: the
domain's ``answer_style``, then the chain's own default, then the model decides).

The first step of every chain, ``configure``, turns the request's choices into one
``Options`` object that the later stages read; nothing downstream parses ``configurable``
again. Keys the chain does not declare are left alone, so our chains compose with parts that
have configurable fields of their own.
"""

import weakref
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Final, Literal

from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.runnables.utils import ConfigurableFieldSpec
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    WithJsonSchema,
    create_model,
)

from ragchains.prompts.registry import (
    DEFAULT_DOMAIN,
    Domain,
    PerLoad,
    Prompt,
    PromptRegistry,
    PromptSelectionError,
)
from ragchains.retrievers.scope import DocumentScope

MAX_K = 200
LATEST = "latest"
DOMAIN_KEY = "domain"
K_KEY = "k"
THRESHOLD_KEY = "threshold"
ANSWER_STYLE_KEY = "answer_style"
AUTO: Final = "auto"
# An enumeration with "auto" for "not chosen here", never an Optional (see above).
AnswerStyle = Literal["auto", "quote", "free"]
ANSWER_STYLES: tuple[str, ...] = ("auto", "quote", "free")


# One annotation object per kind, shared by every chain: LangChain merges the config specs of
# composed runnables and refuses two specs with one id that are not equal. (LangServe checks
# only the bare type of each; the chains and the server's request check enforce the bounds.)
def a_number(value: Any) -> Any:
    """Numbers only: pydantic would take "5" and true for 5 and 1."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a number (not text or true/false)")
    return value


K_TYPE = Annotated[int, Field(ge=1, le=MAX_K), BeforeValidator(a_number)]
# Every scorer's scores, and so its cut, lie in [0, 1].
THRESHOLD_TYPE = Annotated[
    float, Field(ge=0.0, le=1.0, allow_inf_nan=False), BeforeValidator(a_number)
]


def version_key(prompt: str) -> str:
    """The configurable key choosing ``prompt``'s version, e.g. ``answer_version``."""
    return f"{prompt}_version"


def version_text(value: int | str) -> str:
    """2, "2", "V2" and "v2" all mean "v2"; "latest" stays."""
    text = str(value).strip().lower()
    return f"v{text}" if text.isdigit() else text


def version_choices(
    versions: int | str | Mapping[str, int | str] | None, prompt_names: Sequence[str]
) -> dict[str, str]:
    """Prompt versions as ``configurable`` keys: one version (``2`` or ``"v2"``) for every
    prompt in ``prompt_names``, or ``{prompt: version}`` for some of them. A prompt not in
    ``prompt_names`` is a ValueError."""
    if versions is None:
        return {}
    if not isinstance(versions, Mapping):
        return {version_key(name): version_text(versions) for name in prompt_names}
    unknown = sorted(set(versions) - set(prompt_names))
    if unknown:
        raise OptionsError(
            f"no prompt {', '.join(map(repr, unknown))} here; choose from {', '.join(prompt_names)}"
        )
    return {version_key(name): version_text(v) for name, v in versions.items()}


class Options(BaseModel):
    """A request's choices, resolved: the domain (its glossary and multi-query setting), the
    prompt of each name, k and threshold (None when the chain's parts take no such setting).

    Plain data as it dumps (LangServe's stream_log serialises every step's output); the
    prompt objects themselves are kept aside and reached with ``prompt(name)``.
    """

    model_config = ConfigDict(frozen=True)

    domain: str
    glossary: dict[str, str] = Field(
        default_factory=dict, description="abbreviations expanded in search queries"
    )
    multi_query: int = 1
    range_fields: dict[str, list[str]] = Field(
        default_factory=dict, description="numeric fields read from the question's ranges"
    )
    thresholds: dict[str, float] = Field(
        default_factory=dict, description="the domain's compressor cut per scorer kind"
    )
    scope: DocumentScope = Field(
        default_factory=DocumentScope, description="the documents the domain answers from"
    )
    prompts: dict[str, str] = Field(default_factory=dict, description="prompt refs by name")
    k: int | None = None
    threshold: float | None = Field(None, description="the request's own; None: not set")
    answer_style: AnswerStyle = Field(
        AUTO, description="the request's answer style, else the domain's; auto if neither"
    )
    _prompts: dict[str, Prompt] = PrivateAttr(default_factory=dict)

    @classmethod
    def of(
        cls,
        domain: Domain,
        prompts: Mapping[str, Prompt],
        *,
        k: int | None = None,
        threshold: float | None = None,
        answer_style: str = AUTO,
    ) -> "Options":
        options = cls(
            domain=domain.name,
            glossary=domain.query_glossary,
            multi_query=domain.multi_query,
            range_fields=domain.range_fields,
            thresholds=domain.thresholds,
            scope=domain.scope,
            prompts={name: prompt.ref for name, prompt in prompts.items()},
            k=k,
            threshold=threshold,
            answer_style=answer_style if answer_style != AUTO else domain.answer_style,
        )
        options._prompts.update(prompts)
        return options

    def prompt(self, name: str) -> Prompt:
        return self._prompts[name]


def choice_of(choices: Sequence[str]) -> Any:
    """The type of a choice among ``choices`` that are the prompt registry's now: text, whose
    JSON Schema lists them (what LangServe's playground and ``/config_schema`` offer, read
    again on each request). Not a ``Literal``: LangServe checks a request against the bare
    type it saw when its routes were added, so a domain or version added since (a team's
    folder followed live) would be refused; ``Choices.resolve`` checks the name itself."""
    return Annotated[str, WithJsonSchema({"type": "string", "enum": list(choices)})]


class _Specs:
    """The domain and version specs of one load of a registry, built once and shared by its
    chains."""

    def __init__(self, registry: PromptRegistry) -> None:
        domains = tuple(sorted(registry.domains))
        self.domain = ConfigurableFieldSpec(
            id=DOMAIN_KEY,
            annotation=choice_of(domains),
            default=DEFAULT_DOMAIN,
            name="Domain",
            description="which domain's prompt files answer: " + ", ".join(domains),
        )
        self.versions: dict[str, ConfigurableFieldSpec] = {}
        for name in sorted({n for d in registry.domains.values() for n in d.prompts}):
            numbers = sorted(
                {v for d in registry.domains.values() for v in d.prompts.get(name, {})}
            )
            self.versions[name] = ConfigurableFieldSpec(
                id=version_key(name),
                # Plain strings ("v2"), no validator: LangServe rebuilds the config model
                # from bare annotations, so a validator would work in-process only.
                annotation=choice_of((LATEST, *(f"v{n}" for n in numbers))),
                default=LATEST,
                name=f"{name.replace('_', ' ').capitalize()} prompt version",
                description=f"version of the {name} prompt; {LATEST} = the domain's newest",
            )


_SPECS: weakref.WeakKeyDictionary[PromptRegistry, _Specs] = weakref.WeakKeyDictionary()


def _specs(registry: PromptRegistry) -> _Specs:
    """The specs of the registry's current load (a live registry's changes with its folder),
    one object per load, shared by every chain over it."""
    loaded = registry.current()
    found = _SPECS.get(loaded)
    if found is None:
        found = _SPECS[loaded] = _Specs(loaded)
    return found


ANSWER_STYLE_SPEC = ConfigurableFieldSpec(
    id=ANSWER_STYLE_KEY,
    annotation=AnswerStyle,
    default=AUTO,
    name="Answer style",
    description="quote: only sentences copied from the sources, each with its label (models "
    "that take a grammar); free: free generation; auto: the domain's or the server's choice, "
    "else quote for the embedded model and free for others",
)


def k_spec(default: int) -> ConfigurableFieldSpec:
    return ConfigurableFieldSpec(
        id=K_KEY,
        annotation=K_TYPE,
        default=default,
        name="k",
        description=f"chunks retrieved and handed to the compressor (1-{MAX_K})",
    )


def threshold_spec(default: float) -> ConfigurableFieldSpec:
    return ConfigurableFieldSpec(
        id=THRESHOLD_KEY,
        annotation=THRESHOLD_TYPE,
        default=default,
        name="Threshold",
        description="minimum compressor score for a chunk to be kept",
    )


# Where a request's choices travel once resolved (the server resolves them before any work,
# to answer a bad one with a status), so that the chain's configure stage does not resolve
# them again. No spec declares it: it is no choice of the caller's, and a "__" key is not
# copied into the runs' metadata.
RESOLVED_KEY = "__ragchains_options"


class OptionsError(ValueError):
    """A configurable value of the wrong kind (a bad k, a threshold that is not a number)."""


class Choices:
    """The choices one chain offers: the domain, its prompts' versions, and optionally k and
    threshold; a chain with the ``answer`` prompt also the answer style. ``resolve``
    validates a request's ``configurable`` and returns ``Options``.

    ``k`` and ``threshold`` are callables giving the default, asked for only when the specs
    are first needed: a compressor knows its threshold once its scorer has loaded.
    """

    def __init__(
        self,
        registry: PromptRegistry,
        prompt_names: Sequence[str] = (),
        *,
        k: Any = None,
        threshold: Any = None,
    ) -> None:
        self.registry = registry
        self.prompt_names = tuple(prompt_names)
        unknown = [n for n in self.prompt_names if n not in _specs(registry).versions]
        if unknown:
            raise ValueError(f"the prompt registry has no prompt named {', '.join(unknown)}")
        self._k = k
        self._threshold = threshold
        # The specs and their model, of one load of the registry: built again when a live
        # registry has loaded its folder again.
        self._built = PerLoad(self._build)

    def _build(self, loaded: PromptRegistry) -> tuple[list[ConfigurableFieldSpec], type[BaseModel]]:
        shared = _specs(loaded)
        specs = [shared.domain, *(shared.versions[name] for name in self.prompt_names)]
        if "answer" in self.prompt_names:
            specs.append(ANSWER_STYLE_SPEC)
        if self._k is not None:
            specs.append(k_spec(int(self._k())))
        if self._threshold is not None:
            specs.append(threshold_spec(float(self._threshold())))
        model = create_model(  # type: ignore[call-overload]
            "Configurable",
            __config__=ConfigDict(extra="ignore"),
            **{spec.id: (spec.annotation, spec.default) for spec in specs},
        )
        return specs, model

    @property
    def specs(self) -> list[ConfigurableFieldSpec]:
        return list(self._built.get(self.registry)[0])

    def resolve(self, configurable: Mapping[str, Any] | None) -> Options:
        """The chosen domain, prompts, k and threshold; PromptSelectionError for a domain or
        version that does not exist, OptionsError for any other bad value."""
        registry = self.registry.current()  # one load for the whole resolution
        model = self._built.get(registry)[1]
        given = dict(configurable or {})
        if "prompt_version" in given:
            raise OptionsError(
                "prompt_version is replaced by one key per prompt, e.g. "
                + ", ".join(f"{version_key(n)}='v2'" for n in self.prompt_names[:2])
            )
        if given.get(DOMAIN_KEY) is None:
            given.pop(DOMAIN_KEY, None)  # None: the default domain, as when not given
        for name in self.prompt_names:
            if isinstance(given.get(version_key(name)), int | str):
                given[version_key(name)] = version_text(given[version_key(name)])
        try:
            chosen = model.model_validate(given)
        except ValidationError as exc:
            raise _as_options_error(registry, exc) from None
        values = chosen.model_dump()
        domain = registry.domain(values.get(DOMAIN_KEY))
        prompts = {}
        for name in self.prompt_names:
            version = values[version_key(name)]
            prompts[name] = registry.get(domain.name, name, None if version == LATEST else version)
        # A threshold the request does not set stays None, so that the domain's (or else the
        # compressor's own) applies. LangServe fills every declared key with its default, so
        # the compressor's default counts as not set too.
        threshold = values.get(THRESHOLD_KEY)
        if self._threshold is None or threshold == float(self._threshold()):
            threshold = None
        return Options.of(
            domain,
            prompts,
            k=values.get(K_KEY),
            threshold=threshold,
            answer_style=values.get(ANSWER_STYLE_KEY, AUTO),
        )

    def step(self) -> "Configure":
        """The ``configure`` stage: declares the specs (so LangServe and ``config_schema``
        see what the chain lets a request choose) and resolves a request's choices."""
        return Configure(self)


class Configure(RunnableLambda[Any, Options]):
    """``RunnableLambda`` that resolves the request's ``configurable`` into ``Options`` and
    declares what it reads as ``config_specs``, as langchain-core's own
    ``RunnableWithMessageHistory`` declares its session keys. Quick and non-blocking: async
    callers resolve in their own task, not in a worker thread."""

    def __init__(self, choices: "Choices") -> None:
        def configure(_: Any, config: RunnableConfig) -> Options:
            configurable = config.get("configurable") or {}
            resolved = configurable.get(RESOLVED_KEY)
            if isinstance(resolved, Options):  # resolved already, by the server
                return resolved
            return choices.resolve(configurable)

        async def aconfigure(_: Any, config: RunnableConfig) -> Options:
            return configure(_, config)

        super().__init__(configure, afunc=aconfigure, name="configure")
        self.choices = choices

    @property
    def config_specs(self) -> list[ConfigurableFieldSpec]:
        return self.choices.specs


def explain_choice(registry: PromptRegistry, key: str, value: Any) -> str | None:
    """The reason a domain or prompt version a request named does not exist (for a 400),
    or None when ``key`` is neither."""
    if not isinstance(value, str | int):
        return None  # not a name at all: a type error, not a missing domain or version
    if key == DOMAIN_KEY:
        try:
            registry.domain(str(value))
        except PromptSelectionError as exc:
            return str(exc)
        return None
    for name, spec in _specs(registry).versions.items():
        if key == spec.id:
            choices = ", ".join(_spec_choices(spec))
            return f"prompt {name} has no version {value!r}; choose one of: {choices} (as text)"
    return None


def _spec_choices(spec: ConfigurableFieldSpec) -> tuple[str, ...]:
    """The choices a spec made by ``choice_of`` lists."""
    schema = next(m for m in spec.annotation.__metadata__ if isinstance(m, WithJsonSchema))
    return tuple((schema.json_schema or {}).get("enum", ()))


def _as_options_error(registry: PromptRegistry, exc: ValidationError) -> ValueError:
    for err in exc.errors():
        key = str(err["loc"][0]) if err["loc"] else ""
        reason = explain_choice(registry, key, err.get("input"))
        if reason is not None:
            return PromptSelectionError(reason)
    problems = "; ".join(problem_text(err) for err in exc.errors())
    return OptionsError(f"invalid configurable value: {problems}")


def error_message(err: Mapping[str, Any]) -> str:
    """A pydantic error's message, without the "Value error, " pydantic puts before ours."""
    return str(err.get("msg", "")).removeprefix("Value error, ")


def problem_text(err: Mapping[str, Any], *, skip: int = 0) -> str:
    """A pydantic error as one line: where (its ``loc``, the first ``skip`` parts left out)
    and what."""
    where = ".".join(str(p) for p in err.get("loc", ())[skip:])
    return f"{where}: {error_message(err)}" if where else error_message(err)
