"""Finding a run's input files: their source names, the files passed over, and the access
rules the inputs carry in ``.ragchains-access.toml`` files."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from opentelemetry import trace

from ragchains.ingest.errors import IngestError
from ragchains.ingest.loaders import LOADERS
from ragchains.ingest.report import Skipped
from ragchains.retrievers.access import AccessRule, AccessRuleError, sidecar_rules

# Spans for `ragchains ingest` when it exports traces (the API's global provider; without
# one they record nothing).
_tracer = trace.get_tracer(__name__)


@dataclass
class Discovered:
    files: dict[str, Path] = field(default_factory=dict)  # source name -> path
    skipped: list[Skipped] = field(default_factory=list)
    sidecar_rules: list[AccessRule] = field(default_factory=list)  # the inputs' own


def _within(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


@_tracer.start_as_current_span("discover")
def discover(paths: Sequence[str | Path]) -> Discovered:
    """Supported files under the given paths, named ``<root name>/<relative path>``.

    Hidden files and folders are passed over. Symlinks are followed only when they lead to a
    place inside one of the given roots; links to folders are never descended (their targets
    inside the roots are walked anyway, and this rules out cycles). Each folder's
    ``.ragchains-access.toml`` gives ``sidecar_rules``, a deeper folder's first (the more
    specific).
    """
    if not paths:
        raise IngestError("no input paths given")
    roots = [Path(p) for p in paths]
    for root in roots:
        if not root.exists() and not root.is_symlink():
            raise IngestError(f"input path not found: {root}")
    resolved_roots = [r.resolve() for r in roots]
    found = Discovered()
    sidecars: list[tuple[int, list[AccessRule]]] = []

    def add(source: str, path: Path) -> None:
        if source in found.files and found.files[source] != path:
            raise IngestError(
                f"two inputs map to the same source name {source!r}: {found.files[source]} and "
                f"{path}; pass them under different folder names"
            )
        if path.is_symlink():
            target = path.resolve()
            if not _within(target, resolved_roots):
                found.skipped.append(Skipped(source, "symlink leads outside the given roots"))
                return
        if path.suffix.lower() not in LOADERS:
            found.skipped.append(
                Skipped(source, f"unsupported file type {path.suffix or '(no extension)'!r}")
            )
            return
        found.files[source] = path

    for root, resolved in zip(roots, resolved_roots, strict=True):
        if not root.is_dir():
            add(root.name, root)
            continue
        prefix = root.name or resolved.name
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            here = Path(dirpath)
            kept_dirs = []
            for name in sorted(dirnames):
                sub = here / name
                if name.startswith("."):
                    continue
                if sub.is_symlink():
                    if not _within(sub.resolve(), resolved_roots):
                        rel = sub.relative_to(root).as_posix()
                        found.skipped.append(
                            Skipped(f"{prefix}/{rel}", "symlink leads outside the given roots")
                        )
                    continue
                kept_dirs.append(name)
            dirnames[:] = kept_dirs
            folder = here.relative_to(root)
            where = prefix if folder == Path(".") else f"{prefix}/{folder.as_posix()}"
            try:
                sidecars.append((len(folder.parts), sidecar_rules(here, where)))
            except AccessRuleError as exc:
                raise IngestError(str(exc)) from exc
            for name in sorted(filenames):
                if name.startswith("."):
                    continue
                path = here / name
                add(f"{prefix}/{path.relative_to(root).as_posix()}", path)
    sidecars.sort(key=lambda depth_rules: -depth_rules[0])
    found.sidecar_rules = [rule for _, rules in sidecars for rule in rules]
    trace.get_current_span().set_attributes(
        {"ragchains.files.seen": len(found.files), "ragchains.files.skipped": len(found.skipped)}
    )
    return found
