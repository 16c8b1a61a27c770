"""Versioned prompt files and the registry that validates and serves them.

Layout::

    prompts/<domain>/domain.yaml            description, glossary, rewrite options, answer style
    prompts/<domain>/<name>/v<N>.yaml       one prompt version
    prompts/<domain>/suggestions/v<N>.yaml  questions the domain's documents answer, shown
                                            on the chat page before the first question

Every file is checked when the registry loads (at start-up, not at the first request): required
fields, name and version matching the path, declared input variables equal to the template's
real ones, no duplicate versions. A problem raises ``PromptFileError`` naming the file. A
domain that lacks a prompt uses the ``default`` domain's. Requests choose a domain and version;
they can never send prompt text.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from pydantic import BaseModel, ConfigDict, Field, ValidationError

PROMPTS_DIR = Path(__file__).resolve().parent
DEFAULT_DOMAIN = "default"
HISTORY_VARIABLE = "chat_history"
# The prompts the chains use; every domain resolves each (its own or the default domain's).
CHAIN_PROMPTS = ("rewrite", "multi_query", "requery", "answer", "quote")
# The folder of a domain's suggested questions: versioned like a prompt, but no prompt.
SUGGESTIONS = "suggestions"
MAX_SUGGESTIONS = 8
MAX_SUGGESTION_CHARS = 200
_VERSION_FILE = re.compile(r"^v(\d+)\.ya?ml$")
_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")


class PromptFileError(ValueError):
    """A prompt or domain file is invalid; the message starts with its path."""


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


class SuggestionsFile(BaseModel):
    """The schema of ``suggestions/v<N>.yaml``: questions the domain's documents answer."""

    model_config = ConfigDict(extra="forbid")

    name: Literal["suggestions"]
    version: int = Field(ge=1)
    description: str = Field(min_length=1)
    questions: list[str] = Field(min_length=1, max_length=MAX_SUGGESTIONS)


@dataclass(frozen=True)
class Suggestions:
    """One loaded version of a domain's suggested questions."""

    domain: str
    version: int
    description: str
    questions: tuple[str, ...]
    path: Path

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

    @property
    def query_glossary(self) -> dict[str, str]:
        """The abbreviations to expand in search queries (none when expansion is off)."""
        return self.glossary if self.expand_glossary else {}


def _build_template(spec: PromptFile, path: Path) -> ChatPromptTemplate:
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
                raise PromptFileError(f"{path}: a {message.role} message has no content")
            parts.append((message.role, message.content))
    if few_shots and not placed_shots:
        # Default place for examples: right after the leading system message.
        at = 1 if spec.messages[0].role == "system" else 0
        parts[at:at] = few_shots
    try:
        return ChatPromptTemplate.from_messages(parts)
    except (KeyError, ValueError) as exc:
        raise PromptFileError(f"{path}: the template does not parse ({exc})") from exc


def _load_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise PromptFileError(f"{path}: cannot be read as YAML ({exc})") from exc


def _validate(model: type[BaseModel], data: Any, path: Path) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(file)'}: {err['msg']}"
            for err in exc.errors()
        )
        raise PromptFileError(f"{path}: {problems}") from exc


def load_prompt(path: Path, domain: str) -> Prompt:
    spec: PromptFile = _validate(PromptFile, _load_yaml(path), path)
    match = _VERSION_FILE.match(path.name)
    if match is None or int(match.group(1)) != spec.version:
        raise PromptFileError(f"{path}: version {spec.version} does not match the file name")
    if spec.name != path.parent.name:
        raise PromptFileError(f"{path}: name {spec.name!r} does not match its folder")
    template = _build_template(spec, path)
    actual = set(template.input_variables) | {
        v for v in template.optional_variables if v != HISTORY_VARIABLE
    }
    declared = set(spec.input_variables)
    if len(declared) != len(spec.input_variables):
        raise PromptFileError(f"{path}: input_variables lists a variable twice")
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
        raise PromptFileError(f"{path}: input_variables do not match the template ({detail})")
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
    spec: SuggestionsFile = _validate(SuggestionsFile, _load_yaml(path), path)
    match = _VERSION_FILE.match(path.name)
    if match is None or int(match.group(1)) != spec.version:
        raise PromptFileError(f"{path}: version {spec.version} does not match the file name")
    questions = tuple(" ".join(q.split()) for q in spec.questions)
    for n, (question, given) in enumerate(zip(questions, spec.questions, strict=True)):
        if not question or "\n" in given.strip():
            raise PromptFileError(f"{path}: questions.{n}: a question is one line of text")
        if len(question) > MAX_SUGGESTION_CHARS:
            raise PromptFileError(
                f"{path}: questions.{n}: longer than {MAX_SUGGESTION_CHARS} characters"
            )
    if len(set(questions)) != len(questions):
        raise PromptFileError(f"{path}: a question is listed twice")
    return Suggestions(domain, spec.version, spec.description, questions, path)


class PromptRegistry:
    """All domains and prompt versions under one folder, validated at construction."""

    def __init__(self, root: str | Path = PROMPTS_DIR, *, required: tuple[str, ...] = ()) -> None:
        self.root = Path(root)
        self.domains: dict[str, Domain] = {}
        for folder in sorted(p for p in self.root.iterdir() if p.is_dir()):
            if folder.name.startswith(("_", ".")):
                continue
            self.domains[folder.name] = self._load_domain(folder)
        if DEFAULT_DOMAIN not in self.domains:
            raise PromptFileError(f"{self.root}: no {DEFAULT_DOMAIN!r} domain folder")
        for name in required:
            if name not in self.domains[DEFAULT_DOMAIN].prompts:
                raise PromptFileError(
                    f"{self.root / DEFAULT_DOMAIN}: the required prompt {name!r} is missing"
                )

    def _load_domain(self, folder: Path) -> Domain:
        if not _NAME.match(folder.name):
            raise PromptFileError(f"{folder}: domain names are lowercase letters, digits, - and _")
        meta_path = folder / "domain.yaml"
        if not meta_path.is_file():
            raise PromptFileError(f"{folder}: domain.yaml is missing")
        meta: DomainFile = _validate(DomainFile, _load_yaml(meta_path), meta_path)
        domain = Domain(
            name=folder.name,
            description=meta.description,
            glossary=meta.glossary,
            expand_glossary=meta.expand_glossary,
            multi_query=meta.multi_query,
            range_fields=meta.range_fields,
            thresholds=meta.thresholds,
            answer_style=meta.answer_style,
        )
        for prompt_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
            if prompt_dir.name.startswith(("_", ".")):
                continue
            load = load_suggestions if prompt_dir.name == SUGGESTIONS else load_prompt
            versions: dict[int, Any] = {}
            for path in sorted(prompt_dir.iterdir()):
                if path.name.startswith("."):
                    continue
                if not _VERSION_FILE.match(path.name):
                    raise PromptFileError(f"{path}: prompt files are named v<N>.yaml")
                loaded = load(path, folder.name)
                if loaded.version in versions:
                    raise PromptFileError(
                        f"{path}: duplicate version {loaded.version} "
                        f"(also {versions[loaded.version].path.name})"
                    )
                versions[loaded.version] = loaded
            if prompt_dir.name == SUGGESTIONS:
                domain.suggestions = versions
            elif versions:
                domain.prompts[prompt_dir.name] = versions
        return domain

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
        number = _parse_version(wanted)
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


def _parse_version(value: int | str) -> int:
    text = str(value).strip().lower().removeprefix("v")
    if not text.isdigit():
        raise PromptSelectionError(f"prompt version {value!r} is not a number like 2 or 'v2'")
    return int(text)


@functools.cache
def default_registry() -> PromptRegistry:
    """The prompt files shipped with ragchains, loaded and checked once."""
    return PromptRegistry(required=CHAIN_PROMPTS)
