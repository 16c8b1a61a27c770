"""Prompt and domain files read as YAML, and what is wrong with one: its file, line and reason.

A team edits these files by hand, so a problem names the line it is on: YAML's own errors
carry their mark; a schema problem (a missing field, a value of the wrong kind) is placed on
the line of the key it is about, found in the document's node tree (``yaml.compose``), or
of the nearest key above it that the file has.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError


@dataclass(frozen=True)
class FileProblem:
    """One problem of one file: ``path:line: reason`` (no line when it is about the file)."""

    path: Path
    reason: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else str(self.path)
        return f"{where}: {self.reason}"


class PromptFileError(ValueError):
    """A prompt or domain file is invalid; the message starts with its path (and line).
    ``problems`` holds every problem found, the first one in the message."""

    def __init__(self, problems: str | FileProblem | Sequence[FileProblem]) -> None:
        if isinstance(problems, str):
            self.problems: tuple[FileProblem, ...] = ()
            super().__init__(problems)
            return
        found = (problems,) if isinstance(problems, FileProblem) else tuple(problems)
        self.problems = found
        more = len(found) - 1
        tail = f" (and {more} more: `ragchains domains check` lists them)" if more else ""
        super().__init__(f"{found[0]}{tail}")


def load_yaml(path: Path) -> tuple[Any, yaml.Node | None]:
    """The file's data and its node tree (for lines); PromptFileError when it is no YAML."""
    try:
        text = path.read_text(encoding="utf-8")
        return yaml.safe_load(text), yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark is not None else None
        reason = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise PromptFileError(
            FileProblem(path, f"cannot be read as YAML ({reason})", line)
        ) from exc
    except OSError as exc:  # its reason without its path: the problem names the file
        raise PromptFileError(
            FileProblem(path, f"cannot be read ({exc.strerror or type(exc).__name__})")
        ) from exc
    except UnicodeDecodeError as exc:
        raise PromptFileError(FileProblem(path, f"cannot be read as UTF-8 text ({exc})")) from exc


def line_of(node: yaml.Node | None, loc: Iterable[Any]) -> int | None:
    """The line (1-based) of the value at ``loc`` in a composed document, or of the deepest
    part of ``loc`` the document has; None without a document."""
    if node is None:
        return None
    line = node.start_mark.line + 1
    for part in loc:
        child: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if key.value == str(part):
                    child = key if not _has_children(value) else value
                    line = key.start_mark.line + 1
                    break
        elif (
            isinstance(node, yaml.SequenceNode)
            and isinstance(part, int)
            and 0 <= part < len(node.value)
        ):
            child = node.value[part]
            line = child.start_mark.line + 1
        if child is None:
            return line
        node = child
    return line


def _has_children(node: yaml.Node) -> bool:
    return isinstance(node, yaml.MappingNode | yaml.SequenceNode)


def validated(model: type[BaseModel], data: Any, path: Path, document: yaml.Node | None) -> Any:
    """``data`` as ``model``, or PromptFileError listing each problem on its line."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = [
            FileProblem(
                path,
                f"{'.'.join(str(p) for p in err['loc']) or '(file)'}: {_message(err)}",
                line_of(document, err["loc"]),
            )
            for err in exc.errors()
        ]
        raise PromptFileError(problems) from exc


def _message(err: Any) -> str:
    return str(err["msg"]).removeprefix("Value error, ")
