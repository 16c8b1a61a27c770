"""Versioned prompt files and the registry that validates and serves them.

Layout::

    prompts/<domain>/domain.yaml            description, glossary, rewrite options, answer style
    prompts/<domain>/<name>/v<N>.yaml       one prompt version
    prompts/<domain>/suggestions/v<N>.yaml  questions the domain's documents answer, shown
                                            on the chat page before the first question

Every file is checked when the registry loads (at start-up, not at the first request): required
fields, name and version matching the path, declared input variables equal to the template's
real ones, no duplicate versions. ``PromptFileError`` lists every problem, each naming its file
and line (``prompts.problems``). A domain that lacks a prompt uses the ``default`` domain's.
Requests choose a domain and version; they can never send prompt text.

The shipped domains are this package's folders; a team's own domains folder is laid over them
(``prompts.domains``), and a server follows its edits (``prompts.live``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from pydantic import BaseModel, ConfigDict, Field

from ragchains.prompts.problems import (
    FileProblem,
    PromptFileError,
    line_of,
    load_yaml,
    validated,
)
from ragchains.retrievers.scope import DocumentScope

T = TypeVar("T")
PROMPTS_DIR = Path(__file__).resolve().parent
DEFAULT_DOMAIN = "default"
HISTORY_VARIABLE = "chat_history"
# The prompts the chains use; every domain resolves each (its own or the default domain's).
CHAIN_PROMPTS = ("rewrite", "multi_query", "requery", "answer", "quote")
# The folder of a domain's suggested questions: versioned like a prompt, but no prompt.
SUGGESTIONS = "suggestions"
DOMAIN_FILE = "domain.yaml"
MAX_SUGGESTIONS = 8
MAX_SUGGESTION_CHARS = 200
_VERSION_FILE = re.compile(r"^v(\d+)\.ya?ml$")
DOMAIN_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")


class PromptSelectionError(ValueError):
    """A request named a domain, prompt or version that does not exist."""


class ModelParameters(BaseModel):
    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(0.0, ge=0.0, le=2.0)
    max_tokens: int = Field(256, ge=1, le=8192)


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "human", "ai", "history", "few_shots"]
    content: str | None = None


class FewShot(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: str
    output: str


class PromptFile(BaseModel):
    """The schema of ``v<N>.yaml``."""

    model_config = ConfigDict(extra="forbid")

    name: str
    version: int = Field(ge=1)
    description: str = Field(min_length=1)
    input_variables: list[str]
    messages: list[Message] = Field(min_length=1)
    few_shots: list[FewShot] = Field(default_factory=list)
    model_parameters: ModelParameters = Field(default_factory=ModelParameters)


class DomainFile(BaseModel):
    """The schema of ``domain.yaml``."""

    model_config = ConfigDict(extra="forbid")

    description: str = Field(min_length=1)
    glossary: dict[str, str] = Field(default_factory=dict)
    expand_glossary: bool = True
    multi_query: int = Field(1, ge=1, le=5, description="rewrites fused by RRF; 1 = off")
    range_fields: dict[str, list[str]] = Field(
        default_factory=dict,
        description="numeric fields whose ranges are read from the question (under / over / "
        "between N), each with the words that point at it, e.g. price: [cost, dollars, $]",
    )
    thresholds: dict[str, float] = Field(
        default_factory=dict,
        description="the compressor's cut for this domain's documents, per scorer kind "
        "(embedding-similarity, cross-encoder), when a request sets no threshold",
    )
    answer_style: Literal["auto", "quote", "free"] = Field(
        "auto",
        description="quote: answers copy sentences from the sources; free: free generation; "
        "auto: the server's setting decides. A request's answer_style wins over it",
    )
    documents: DocumentScope = Field(
        default_factory=DocumentScope,
        description="the documents this domain answers from (paths and metadata filters); "
        "none given: every document",
    )


class SuggestionsFile(BaseModel):
    """The schema of ``suggestions/v<N>.yaml``: questions the domain's documents answer."""

    model_config = ConfigDict(extra="forbid")

    name: Literal["suggestions"]
    version: int = Field(ge=1)
    description: str = Field(min_length=1)
    questions: list[str] = Field(min_length=1, max_length=MAX_SUGGESTIONS)
    documents: DocumentScope = Field(
        default_factory=DocumentScope,
        description="the files the questions are about: they are offered only to a caller "
        "who may read one of them (none given: any of the domain's)",
    )


@dataclass(frozen=True)
class Suggestions:
    """One loaded version of a domain's suggested questions."""

    domain: str
    version: int
    description: str
    questions: tuple[str, ...]
    path: Path
    scope: DocumentScope = field(default_factory=DocumentScope)

    @property
    def ref(self) -> str:
        """``domain/suggestions@vN``, as a prompt's ref."""
        return f"{self.domain}/{SUGGESTIONS}@v{self.version}"


@dataclass(frozen=True)
class Prompt:
    """One loaded prompt version: the template plus what it was built from."""

    domain: str
    name: str
    version: int
    description: str
    template: ChatPromptTemplate
    input_variables: tuple[str, ...]
    model_parameters: ModelParameters
    path: Path
    # The few-shot examples' replies: what a model may copy into a reply to an unrelated
    # question (chains.queryguard refuses a query that does).
    examples: tuple[str, ...] = ()

    @property
    def ref(self) -> str:
        """``domain/name@vN``: echoed in responses and evaluation results."""
        return f"{self.domain}/{self.name}@v{self.version}"


@dataclass
class Domain:
    name: str
    description: str
    glossary: dict[str, str]
    expand_glossary: bool
    multi_query: int
    range_fields: dict[str, list[str]] = field(default_factory=dict)
    thresholds: dict[str, float] = field(default_factory=dict)
    answer_style: str = "auto"
    prompts: dict[str, dict[int, Prompt]] = field(default_factory=dict)
    suggestions: dict[int, Suggestions] = field(default_factory=dict)
    # The documents it answers from (every document when empty).
    scope: DocumentScope = field(default_factory=DocumentScope)
    # Where it was read from: the package's prompts/ or a team's domains folder.
    folder: Path | None = None

    @property
    def query_glossary(self) -> dict[str, str]:
        """The abbreviations to expand in search queries (none when expansion is off)."""
        return self.glossary if self.expand_glossary else {}


def _build_template(spec: PromptFile) -> ChatPromptTemplate:
    """The chat template of a prompt file; ValueError saying what does not parse."""
    parts: list[Any] = []
    few_shots: list[BaseMessage] = []
    for shot in spec.few_shots:
        # Literal messages: braces in examples (JSON, say) are text, not variables.
        few_shots += [HumanMessage(content=shot.input), AIMessage(content=shot.output)]
    placed_shots = False
    for message in spec.messages:
        if message.role == "history":
            parts.append(MessagesPlaceholder(HISTORY_VARIABLE, optional=True))
        elif message.role == "few_shots":
            parts.extend(few_shots)
            placed_shots = True
        else:
            if not message.content:
                raise ValueError(f"a {message.role} message has no content")
            parts.append((message.role, message.content))
    if few_shots and not placed_shots:
        # Default place for examples: right after the leading system message.
        at = 1 if spec.messages[0].role == "system" else 0
        parts[at:at] = few_shots
    try:
        return ChatPromptTemplate.from_messages(parts)
    except (KeyError, ValueError) as exc:
        raise ValueError(f"the template does not parse ({exc})") from exc


def _problem(path: Path, document: Any, loc: tuple[Any, ...], reason: str) -> PromptFileError:
    """A problem of ``path`` on the line of ``loc`` (a key path in the file)."""
    return PromptFileError(FileProblem(path, reason, line_of(document, loc)))


def load_prompt(path: Path, domain: str) -> Prompt:
    data, document = load_yaml(path)
    spec: PromptFile = validated(PromptFile, data, path, document)
    match = _VERSION_FILE.match(path.name)
    if match is None or int(match.group(1)) != spec.version:
        raise _problem(
            path, document, ("version",), f"version {spec.version} does not match the file name"
        )
    if spec.name != path.parent.name:
        raise _problem(path, document, ("name",), f"name {spec.name!r} does not match its folder")
    try:
        template = _build_template(spec)
    except ValueError as exc:
        raise _problem(path, document, ("messages",), str(exc)) from exc
    actual = set(template.input_variables) | {
        v for v in template.optional_variables if v != HISTORY_VARIABLE
    }
    declared = set(spec.input_variables)
    if len(declared) != len(spec.input_variables):
        raise _problem(
            path, document, ("input_variables",), "input_variables lists a variable twice"
        )
    if declared != actual:
        missing, extra = sorted(actual - declared), sorted(declared - actual)
        detail = "; ".join(
            part
            for part in (
                f"used but not declared: {', '.join(missing)}" if missing else "",
                f"declared but not used: {', '.join(extra)}" if extra else "",
            )
            if part
        )
        raise _problem(
            path,
            document,
            ("input_variables",),
            f"input_variables do not match the template ({detail})",
        )
    return Prompt(
        domain=domain,
        name=spec.name,
        version=spec.version,
        description=spec.description,
        template=template,
        input_variables=tuple(spec.input_variables),
        model_parameters=spec.model_parameters,
        path=path,
        examples=tuple(shot.output for shot in spec.few_shots),
    )


def load_suggestions(path: Path, domain: str) -> Suggestions:
    """A ``suggestions/v<N>.yaml`` file, checked: schema, version against the file name, and
    each question one line, not blank, at most ``MAX_SUGGESTION_CHARS``, none twice."""
    data, document = load_yaml(path)
    spec: SuggestionsFile = validated(SuggestionsFile, data, path, document)
    match = _VERSION_FILE.match(path.name)
    if match is None or int(match.group(1)) != spec.version:
        raise _problem(
            path, document, ("version",), f"version {spec.version} does not match the file name"
        )
    questions = tuple(" ".join(q.split()) for q in spec.questions)
    for n, (question, given) in enumerate(zip(questions, spec.questions, strict=True)):
        where = ("questions", n)
        if not question or "\n" in given.strip():
            raise _problem(path, document, where, f"questions.{n}: a question is one line of text")
        if len(question) > MAX_SUGGESTION_CHARS:
            raise _problem(
                path,
                document,
                where,
                f"questions.{n}: longer than {MAX_SUGGESTION_CHARS} characters",
            )
    if len(set(questions)) != len(questions):
        raise _problem(path, document, ("questions",), "a question is listed twice")
    return Suggestions(domain, spec.version, spec.description, questions, path, spec.documents)


def load_domain(folder: Path, problems: list[FileProblem]) -> Domain | None:
    """The domain in ``folder``: its ``domain.yaml`` and every prompt and suggestions file.
    Each file's problem is added to ``problems`` and the others are still read (a team
    fixing its folder sees them all at once); None when the domain cannot be served."""
    if not DOMAIN_NAME.match(folder.name):
        problems.append(FileProblem(folder, "domain names are lowercase letters, digits, - and _"))
        return None
    meta_path = folder / DOMAIN_FILE
    if not meta_path.is_file():
        problems.append(FileProblem(folder, f"{DOMAIN_FILE} is missing"))
        return None
    found = len(problems)
    try:
        data, document = load_yaml(meta_path)
        meta: DomainFile = validated(DomainFile, data, meta_path, document)
    except PromptFileError as exc:
        problems.extend(exc.problems)
        meta = None  # type: ignore[assignment]
    domain = (
        Domain(
            name=folder.name,
            description=meta.description,
            glossary=meta.glossary,
            expand_glossary=meta.expand_glossary,
            multi_query=meta.multi_query,
            range_fields=meta.range_fields,
            thresholds=meta.thresholds,
            answer_style=meta.answer_style,
            scope=meta.documents,
            folder=folder,
        )
        if meta is not None
        else None
    )
    for prompt_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
        if prompt_dir.name.startswith(("_", ".")):
            continue
        load = load_suggestions if prompt_dir.name == SUGGESTIONS else load_prompt
        versions: dict[int, Any] = {}
        for path in sorted(prompt_dir.iterdir()):
            if _not_a_version(path.name):
                continue
            if not _VERSION_FILE.match(path.name):
                problems.append(FileProblem(path, "prompt files are named v<N>.yaml"))
                continue
            try:
                loaded = load(path, folder.name)
            except PromptFileError as exc:
                problems.extend(exc.problems)
                continue
            if loaded.version in versions:
                problems.append(
                    FileProblem(
                        path,
                        f"duplicate version {loaded.version} "
                        f"(also {versions[loaded.version].path.name})",
                    )
                )
                continue
            versions[loaded.version] = loaded
        if domain is None:
            continue
        if prompt_dir.name == SUGGESTIONS:
            domain.suggestions = versions
        elif versions:
            domain.prompts[prompt_dir.name] = versions
    return domain if len(problems) == found else None


def _not_a_version(name: str) -> bool:
    """A file a prompt folder may hold beside its versions: hidden ones, and the copies
    editors keep while a file is open or of its last save (``v1.yaml~``, ``#v1.yaml#``)."""
    return name.startswith((".", "#")) or name.endswith("~")


def domain_folders(root: Path) -> list[Path]:
    """The domain folders under ``root``, by name (``_`` and ``.`` folders are not)."""
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))


class PromptRegistry:
    """The domains served and their prompt versions, validated at construction.

    ``root``: the shipped domains (``prompts/`` of the package). ``team``: a domains folder
    of a team's own (``RAGCHAINS_DOMAINS``), whose domains replace the shipped examples (see
    ``prompts.domains``); None: the shipped domains are served. ``required``: prompts the
    served ``default`` domain must have. A PromptFileError lists every problem found.
    """

    def __init__(
        self,
        root: str | Path = PROMPTS_DIR,
        *,
        required: tuple[str, ...] = (),
        team: str | Path | None = None,
    ) -> None:
        # Imported here: prompts.domains lays the team's folder over this module's loading.
        from ragchains.prompts.domains import served_domains

        self.root = Path(root)
        self.team = Path(team) if team is not None else None
        try:
            served = served_domains(self.root, self.team, required)
        except OSError as exc:  # a folder that cannot be listed: its reason, not its path
            where = Path(exc.filename) if exc.filename else self.team or self.root
            reason = f"cannot be read ({exc.strerror or type(exc).__name__})"
            raise PromptFileError(FileProblem(where, reason)) from exc
        self._domains: dict[str, Domain] = served.domains
        self.replaced: tuple[str, ...] = served.replaced

    @property
    def domains(self) -> dict[str, Domain]:
        """Every domain served, by name."""
        return self._domains

    def current(self) -> PromptRegistry:
        """The registry as loaded now: this one (a ``LiveRegistry`` gives its last good
        load). Code that reads it twice for one request reads it once, through this."""
        return self

    # -- selection --------------------------------------------------------------------
    def domain(self, name: str | None) -> Domain:
        name = name or DEFAULT_DOMAIN
        if name not in self.domains:
            raise PromptSelectionError(
                f"unknown domain {name!r}; available: {', '.join(sorted(self.domains))}"
            )
        return self.domains[name]

    def versions(self, domain: str | None, name: str) -> dict[int, Prompt]:
        """The versions of prompt ``name`` that ``domain`` answers with: its own, or the
        default domain's when it has none."""
        own = self.domain(domain).prompts.get(name)
        return own or self.domains[DEFAULT_DOMAIN].prompts.get(name) or {}

    def get(
        self,
        domain: str | None,
        name: str,
        version: int | str | Mapping[str, int | str] | None = None,
    ) -> Prompt:
        """The prompt ``name`` of ``domain`` (or of ``default`` if the domain lacks it).

        ``version`` is a number for every prompt, a ``{name: number}`` mapping, or None for
        the latest. A version that does not exist is an error, never a silent fallback.
        """
        chosen = self.domain(domain)
        versions = self.versions(chosen.name, name)
        if not versions:
            raise PromptSelectionError(f"no prompt {name!r} in domain {chosen.name!r}")
        wanted = version.get(name) if isinstance(version, Mapping) else version
        if wanted is None:
            return versions[max(versions)]
        number = _version_number(wanted)
        if number not in versions:
            owner = next(iter(versions.values())).domain
            available = ", ".join(f"v{v}" for v in sorted(versions))
            raise PromptSelectionError(
                f"prompt {owner}/{name} has no version {wanted!r}; available: {available}"
            )
        return versions[number]

    def suggestions(
        self, domain: str | None, version: int | str | None = None
    ) -> Suggestions | None:
        """The suggested questions of ``domain`` (latest version unless one is named), or
        None when it has none: another domain's questions would not be about its documents."""
        versions = self.domain(domain).suggestions
        if not versions:
            return None
        if version is None:
            return versions[max(versions)]
        number = _parse_version(version)
        if number not in versions:
            available = ", ".join(f"v{v}" for v in sorted(versions))
            raise PromptSelectionError(
                f"{self.domain(domain).name}/{SUGGESTIONS} has no version {version!r}; "
                f"available: {available}"
            )
        return versions[number]

    def select(self, name: str, configurable: Mapping[str, Any] | None) -> Prompt:
        """The prompt ``name`` for ``{"domain": …, "prompt_version": …}`` (the evaluation's
        judge and generator prompts; the chains choose theirs through ``chains.options``)."""
        chosen = configurable or {}
        return self.get(chosen.get("domain"), name, chosen.get("prompt_version"))


class PerLoad(Generic[T]):
    """A value made from one load of a registry (``build(load)``), made again once the
    registry serves another load (a live registry's folder edited): what the chains and the
    routes derive from the domains (config specs and models, tool arguments) follows them."""

    def __init__(self, build: Callable[[PromptRegistry], T]) -> None:
        self._build = build
        self._held: tuple[PromptRegistry, T] | None = None

    def get(self, registry: PromptRegistry) -> T:
        loaded = registry.current()
        held = self._held  # once: another thread may replace it meanwhile
        if held is None or held[0] is not loaded:
            held = self._held = loaded, self._build(loaded)
        return held[1]


def _version_number(value: int | str) -> int | None:
    """2, "2", "v2" and "V2" are 2; None for text that names no version."""
    text = str(value).strip().lower().removeprefix("v")
    return int(text) if text.isdigit() else None


def _parse_version(value: int | str) -> int:
    text = str(value).strip().lower().removeprefix("v")
    if not text.isdigit():
        raise PromptSelectionError(f"prompt version {value!r} is not a number like 2 or 'v2'")
    return int(text)


@functools.cache
def default_registry() -> PromptRegistry:
    """The prompt files shipped with ragchains, loaded and checked once."""
    return PromptRegistry(required=CHAIN_PROMPTS)
