"""A prompt registry that follows a team's domains folder while the server runs.

The folder is looked at every half second (a ``stat`` of each file: a domains folder holds
tens of files). When something changed, the whole folder is loaded again, checked as at
start-up, and served only if every file passes: a new domain, a new prompt version (``latest``
moves to it), an edited glossary or scope. An edit that does not pass is not served: the last
good load keeps serving, and ``problem`` (which ``/readyz`` and the log show) names the file,
the line and the reason until an edit fixes it.

Polled (``ragchains.polling``), as an index folder is: the folder is small. Each request
reads the registry once (``current()``), so one request never mixes two loads.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ragchains.polling import Poller
from ragchains.prompts.problems import FileProblem, PromptFileError
from ragchains.prompts.registry import Domain, Prompt, PromptRegistry, Suggestions

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5
# An editor's save can take several writes; a change is loaded once the folder has held
# still this long (a half-written file would be a problem reported for nothing).
SETTLE_SECONDS = 0.15

Stamp = tuple[tuple[str, int, int, int, int], ...]


# Settling waits at most this many looks: a folder written to without pause is loaded anyway.
MAX_SETTLE_LOOKS = 20


def folder_stamp(root: Path) -> Stamp:
    """What stat says of every file and folder under ``root`` (name, size, mtime, ctime,
    inode: ctime moves on a chmod too, which can make an unreadable file readable),
    through symbolic links as the loader reads them (a domain folder may be a link to a
    checkout elsewhere; each real folder once, so a link loop ends): it changes when anything
    is added, removed, renamed or written."""
    seen: list[tuple[str, int, int, int, int]] = []
    walked: set[tuple[int, int]] = set()
    for folder, dirs, files in os.walk(root, followlinks=True):
        try:
            here = os.stat(folder)
        except OSError:
            continue
        if (here.st_dev, here.st_ino) in walked:
            dirs[:] = []  # a link back to a folder already walked
            continue
        walked.add((here.st_dev, here.st_ino))
        dirs.sort()
        for name in (*dirs, *sorted(files)):
            path = os.path.join(folder, name)
            try:
                st = os.stat(path)
            except OSError:  # removed while walking: the next look sees the rest
                continue
            seen.append(
                (os.path.relpath(path, root), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
            )
    return tuple(seen)


def served_refs(registry: PromptRegistry) -> set[str]:
    """Each domain and prompt version served, as ``domain`` and ``domain/name@vN``."""
    refs = set(registry.domains)
    for domain in registry.domains.values():
        refs.update(p.ref for versions in domain.prompts.values() for p in versions.values())
    return refs


class LiveRegistry(PromptRegistry):
    """The last good load of ``load()`` (a ``PromptRegistry`` of the team's folder), loaded
    again when ``folder`` changes (``watch``, or ``refresh`` by hand). The first load must
    pass: a server does not start on a broken folder."""

    def __init__(
        self,
        load: Callable[[], PromptRegistry],
        folder: Path,
        *,
        poll: float = POLL_SECONDS,
    ) -> None:
        # No PromptRegistry.__init__: this registry holds loads, it is not one.
        self._load = load
        self.folder = folder
        self.poll = poll
        self._stamp = folder_stamp(folder)
        self._current = load()
        self._problem: PromptFileError | None = None
        self._lock = threading.Lock()
        self._watcher = Poller(self.refresh, poll, name="ragchains-domains-watch")

    # -- what a request reads: the current load ------------------------------------------
    def current(self) -> PromptRegistry:
        return self._current

    @property
    def domains(self) -> dict[str, Domain]:
        return self._current.domains

    @property
    def root(self) -> Path:  # type: ignore[override]
        return self._current.root

    @property
    def team(self) -> Path | None:  # type: ignore[override]
        return self._current.team

    @property
    def replaced(self) -> tuple[str, ...]:  # type: ignore[override]
        return self._current.replaced

    def domain(self, name: str | None) -> Domain:
        return self._current.domain(name)

    def versions(self, domain: str | None, name: str) -> dict[int, Prompt]:
        return self._current.versions(domain, name)

    def get(
        self,
        domain: str | None,
        name: str,
        version: int | str | Mapping[str, int | str] | None = None,
    ) -> Prompt:
        return self._current.get(domain, name, version)

    def suggestions(
        self, domain: str | None, version: int | str | None = None
    ) -> Suggestions | None:
        return self._current.suggestions(domain, version)

    def select(self, name: str, configurable: Mapping[str, Any] | None) -> Prompt:
        return self._current.select(name, configurable)

    # -- following the folder --------------------------------------------------------------
    @property
    def problem(self) -> PromptFileError | None:
        """Why the folder as it is now is not served (None: it is)."""
        return self._problem

    def problems_shown(self) -> list[str]:
        """The problems of the folder as it is now (none while it is served), each as
        ``file:line: reason`` with the file named inside the folder (a probe that needs no
        key must not tell the server's paths)."""
        problem = self._problem  # once: a look may clear it meanwhile
        if problem is None:
            return []
        found = problem.problems or (FileProblem(self.folder, str(problem)),)
        return [str(replace(p, path=_inside(p.path, self.folder))) for p in found]

    def refresh(self) -> bool:
        """Load the folder again if it changed since the last look; whether a new load is
        now served."""
        with self._lock:
            stamp = folder_stamp(self.folder)
            if stamp == self._stamp:
                return False
            for _ in range(MAX_SETTLE_LOOKS):  # until it holds still: an editor may be writing
                time.sleep(SETTLE_SECONDS)
                settled = folder_stamp(self.folder)
                if settled == stamp:
                    break
                stamp = settled
            try:
                loaded = self._load()
            except PromptFileError as exc:
                # Files that do not check out wait for an edit; a folder that could not be
                # read (its permissions, one removed while it was read) is tried again at
                # the next look.
                if not isinstance(exc.__cause__, OSError):
                    self._stamp = stamp
                if self._problem is None or str(exc) != str(self._problem):
                    log.warning("domains not reloaded, the last good ones still serve: %s", exc)
                self._problem = exc
                return False
            self._stamp = stamp
            before, after = served_refs(self._current), served_refs(loaded)
            self._current, self._problem = loaded, None
        added, removed = sorted(after - before), sorted(before - after)
        log.info(
            "domains reloaded from %s%s%s",
            self.folder,
            f"; now served: {', '.join(added)}" if added else "",
            f"; no longer served: {', '.join(removed)}" if removed else "",
        )
        return True

    def watch(self) -> None:
        """Look at the folder every ``poll`` seconds in a thread of its own, until
        ``close``."""
        self._watcher.start()

    def close(self) -> None:
        self._watcher.stop()


def _inside(path: Path, folder: Path) -> Path:
    """``path`` relative to ``folder`` (the folder's own name first), else its name."""
    try:
        return Path(folder.name) / path.relative_to(folder)
    except ValueError:
        return Path(path.name)
