"""mypy over the ragchains.* tree as it installs, with messages naming the repository's files.

pyproject.toml's package-dir installs chains/ as ragchains.chains (and so on); an editable
install finds them through setuptools' import hook, which mypy cannot follow. So mypy reads
build/typecheck/ragchains, links laid out from pyproject.toml as the wheel holds the package
(chains -> chains/, server.py -> server.py, cli -> ragchains/cli, ...), and the paths it prints
are turned back into the files' own: chains/graph.py, not build/typecheck/.../graph.py.

    python scripts/typecheck.py [mypy options]      (what `make lint` runs)
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tomllib
from pathlib import Path

from mypy import api

REPO = Path(__file__).resolve().parent.parent
TREE = REPO / "build" / "typecheck"  # [tool.mypy] mypy_path
PACKAGE = "ragchains"


def layout() -> dict[str, Path]:
    """Each entry of the installed package, by name, and what it holds in the repository."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    package_dir: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    entries = {p.name: p for p in (REPO / PACKAGE).iterdir() if p.name != "__pycache__"}
    for name, source in package_dir.items():
        parent, _, leaf = name.rpartition(".")
        if parent != PACKAGE:
            sys.exit(f"typecheck: cannot lay out {name}: package-dir maps only into {PACKAGE}")
        path = REPO / source
        if path.is_dir():
            entries[leaf] = path
        else:  # a module: setuptools maps it by its path less the suffix
            entries[f"{leaf}.py"] = path.with_name(f"{path.name}.py")
    return entries


def link(entries: dict[str, Path]) -> None:
    """Brings the links in TREE in line with entries, touching none that already are: another
    run of this script (another developer's `make lint`) may be reading them."""
    folder = TREE / PACKAGE
    folder.mkdir(parents=True, exist_ok=True)
    for stale in set(os.listdir(folder)) - set(entries):
        (folder / stale).unlink(missing_ok=True)
    for name, target in entries.items():
        path = folder / name
        if path.is_symlink() and Path(os.readlink(path)) == target:
            continue
        path.unlink(missing_ok=True)
        with contextlib.suppress(FileExistsError):  # made meanwhile by a concurrent run
            path.symlink_to(target)


def main() -> int:
    entries = layout()
    link(entries)
    own = {name: target.relative_to(REPO).as_posix() for name, target in entries.items()}
    tree = "|".join(re.escape(p) for p in (TREE.as_posix(), TREE.relative_to(REPO).as_posix()))
    printed = re.compile(rf"(?:{tree})/{PACKAGE}/([^/\s:]+)")

    def real(text: str) -> str:
        return printed.sub(lambda m: own.get(m[1], m[0]), text)

    out, err, status = api.run(["--config-file", str(REPO / "pyproject.toml"), *sys.argv[1:]])
    sys.stdout.write(real(out))
    sys.stderr.write(real(err))
    return status


if __name__ == "__main__":
    sys.exit(main())
