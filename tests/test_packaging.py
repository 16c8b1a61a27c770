"""What a user's site-packages gets: one top-level package, ``ragchains``, holding the folders
the repository keeps at its top (chains/, retrievers/, prompts/, ingest/, evaluation/,
server.py) as ``ragchains.chains``, ``ragchains.retrievers``, ... Built from a clone of the
committed HEAD made without symlink support (``git -c core.symlinks=false clone``, Windows'
default), as a wheel and as an editable install, without the network."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

PIP = [sys.executable, "-m", "pip"]

# Where each package's files are in the repository (DESIGN.md, "Layout"); ragchains.server is
# server.py.
LAYOUT = {
    "ragchains": "ragchains",
    "ragchains.chains": "chains",
    "ragchains.retrievers": "retrievers",
    "ragchains.prompts": "prompts",
    "ragchains.ingest": "ingest",
    "ragchains.evaluation": "evaluation",
}
BARE = ("chains", "retrievers", "prompts", "ingest", "evaluation", "server")

# Imports every module named on its command line from one install, and nothing from the
# checkout: run with -S, it gets this interpreter's library folders as plain paths (their .pth
# files, the checkout's editable import hook among them, are not read), the checkout's own
# folder left out, and the install under test first.
PROBE = """
import importlib, importlib.metadata, importlib.resources, importlib.util, json, site, sys
kind, install, libraries, packages, bare, names = sys.argv[1:6] + [sys.argv[6:]]
if kind == "editable":
    site.addsitedir(install)  # reads its .pth: setuptools' import hook for the clone
else:
    sys.path.insert(0, install)
sys.path.extend(json.loads(libraries))
files = {name: importlib.import_module(name).__file__ for name in names}
print(json.dumps({
    "files": files,
    "data": {p: str(importlib.resources.files(p)) for p in json.loads(packages)},
    "bare": [n for n in json.loads(bare) if importlib.util.find_spec(n) or n in sys.modules],
    "script": importlib.metadata.entry_points(group="console_scripts")["ragchains"].value,
    "loaded": sorted(n for n in sys.modules if n == "ragchains" or n.startswith("ragchains.")),
}))
"""


def run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, env=env, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def modules(checkout: Path) -> dict[str, tuple[str, str]]:
    """Every ragchains module by name: its file in the checkout, and in an install."""
    found = {"ragchains.server": ("server.py", "ragchains/server.py")}
    for package, folder in LAYOUT.items():
        for path in sorted((checkout / folder).rglob("*.py")):
            inside = path.relative_to(checkout / folder)
            parts = inside.with_suffix("").parts
            name = ".".join((package, *parts[: -1 if parts[-1] == "__init__" else None]))
            installed = Path(*package.split("."), inside).as_posix()
            found[name] = (path.relative_to(checkout).as_posix(), installed)
    return found


def probe(kind: str, install: Path, names: list[str], cwd: Path) -> dict[str, object]:
    libraries = [p for p in sys.path if p and Path(p).resolve() != REPO.resolve()]
    args = (kind, str(install), json.dumps(libraries), json.dumps(list(LAYOUT)), json.dumps(BARE))
    # -P: the probe's folder is not put on sys.path either.
    out = run(sys.executable, "-S", "-P", "-c", PROBE, *args, *names, cwd=cwd)
    result: dict[str, object] = json.loads(out)
    return result


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed HEAD, checked out as on a system without symlinks."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    head = run("git", "rev-parse", "HEAD", cwd=REPO).strip()
    target = tmp_path_factory.mktemp("clone") / "ragchains"
    run("git", "-c", "core.symlinks=false", "clone", "--quiet", "--no-checkout", str(REPO),
        str(target), cwd=REPO)  # fmt: skip
    run("git", "-c", "core.symlinks=false", "checkout", "--quiet", "--detach", head, cwd=target)
    return target


@pytest.fixture(scope="module")
def installed(clone: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from the clone, installed (without dependencies) into a folder."""
    wheels = tmp_path_factory.mktemp("wheel")
    run(*PIP, "wheel", "--quiet", "--no-index", "--no-deps", "--no-build-isolation",
        "-w", str(wheels), ".", cwd=clone)  # fmt: skip
    (wheel,) = wheels.glob("ragchains-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
    assert tops == {"ragchains", wheel.name.split("-py3")[0] + ".dist-info"}
    target = tmp_path_factory.mktemp("site")
    run(*PIP, "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
        "--target", str(target), str(wheel), cwd=target)  # fmt: skip
    return target


@pytest.fixture(scope="module")
def editable(clone: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The clone's editable install, as `make setup` makes it (unpacked into a folder)."""
    wheels = tmp_path_factory.mktemp("editable-wheel")
    build = "import sys; from setuptools import build_meta; build_meta.build_editable(sys.argv[1])"
    run(sys.executable, "-c", build, str(wheels), cwd=clone)
    (wheel,) = wheels.glob("ragchains-*.whl")
    target = tmp_path_factory.mktemp("editable")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target)
    return target


def test_no_symlinks_are_committed() -> None:
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    entries = run("git", "ls-files", "-s", cwd=REPO).splitlines()
    assert [entry for entry in entries if entry.startswith("120000 ")] == []


@pytest.mark.slow
def test_pip_show_lists_no_top_level_package_but_ragchains(installed: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(installed)}
    shown = run(*PIP, "show", "-f", "ragchains", cwd=installed, env=env)
    assert f"Location: {installed}" in shown
    files = [line.strip() for line in shown.split("Files:", 1)[1].splitlines() if line.strip()]
    tops = {
        path.split("/")[0]
        for path in files
        if not path.startswith("..") and ".dist-info" not in path.split("/")[0]
    }
    assert tops == {"ragchains"}, tops
    for expected in (
        "ragchains/server.py",
        "ragchains/chains/graph.py",
        "ragchains/retrievers/hybrid.py",
        "ragchains/cli/__init__.py",
        "ragchains/prompts/hr/answer/v2.yaml",
        "ragchains/evaluation/prompts/default/groundedness/v1.yaml",
        "ragchains/web/index.html",
        "ragchains/web/app.js",
        "ragchains/web/app.css",
    ):
        assert expected in files, expected


@pytest.mark.slow
def test_the_wheel_imports_every_module_by_one_name(
    clone: Path, installed: Path, tmp_path: Path
) -> None:
    expected = modules(clone)
    got = probe("wheel", installed, sorted(expected), cwd=tmp_path)
    files = got["files"]
    assert isinstance(files, dict)
    assert files == {name: str(installed / wheel) for name, (_, wheel) in expected.items()}
    assert sorted(p.relative_to(installed).as_posix() for p in installed.rglob("*.py")) == sorted(
        wheel for _, wheel in expected.values()
    )
    assert got["loaded"] == sorted(expected)  # nothing else of ragchains came along
    assert got["bare"] == []
    assert got["script"] == "ragchains.cli:run"


@pytest.mark.slow
def test_the_editable_install_holds_the_same_tree(
    clone: Path, installed: Path, editable: Path, tmp_path: Path
) -> None:
    expected = modules(clone)
    got = probe("editable", editable, sorted(expected), cwd=tmp_path)
    files = got["files"]
    assert isinstance(files, dict)
    assert files == {name: str(clone.resolve() / source) for name, (source, _) in expected.items()}
    assert got["bare"] == []
    assert got["script"] == "ragchains.cli:run"
    # Package data: each file the wheel holds is found through the editable install too.
    data = got["data"]
    assert isinstance(data, dict)
    assert data == {package: str(clone.resolve() / folder) for package, folder in LAYOUT.items()}
    held = [p for p in (installed / "ragchains").rglob("*") if p.is_file() and p.suffix != ".py"]
    assert len(held) > 20
    for path in held:
        package = max(
            (p for p in LAYOUT if path.is_relative_to(installed.joinpath(*p.split(".")))), key=len
        )
        inside = path.relative_to(installed.joinpath(*package.split(".")))
        assert (Path(data[package]) / inside).is_file(), path.relative_to(installed)
