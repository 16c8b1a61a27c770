"""What a user's site-packages gets: one top-level package, ``ragchains``, holding the folders
the repository keeps at its top (chains/, retrievers/, prompts/, ingest/, evaluation/,
server.py) as ``ragchains.chains``, ``ragchains.retrievers``, ..."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow

PIP = [sys.executable, "-m", "pip"]


def run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, env=env, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


# What the build reads; copied (links kept) so setuptools' build/ stays out of the checkout.
SOURCES = ("pyproject.toml", "README.md", "server.py", "ragchains", "chains", "retrievers",
           "prompts", "ingest", "evaluation")  # fmt: skip


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from this checkout, installed (without dependencies) into a folder."""
    source = tmp_path_factory.mktemp("source")
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "baselines")
    for name in SOURCES:
        if (REPO / name).is_dir() and not (REPO / name).is_symlink():
            shutil.copytree(REPO / name, source / name, symlinks=True, ignore=skip)
        else:
            shutil.copy2(REPO / name, source / name, follow_symlinks=False)
    wheels = tmp_path_factory.mktemp("wheel")
    run(*PIP, "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(wheels), ".",
        cwd=source)  # fmt: skip
    (wheel,) = wheels.glob("ragchains-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
    assert tops == {"ragchains", wheel.name.split("-py3")[0] + ".dist-info"}
    target = tmp_path_factory.mktemp("site")
    run(*PIP, "install", "--quiet", "--no-deps", "--no-compile", "--target", str(target),
        str(wheel), cwd=target)  # fmt: skip
    return target


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


def test_the_installed_package_imports_without_the_checkout(installed: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(installed)}
    probe = (
        "import importlib.util, ragchains.chains.graph, ragchains.server;"
        "print(ragchains.chains.graph.__file__);"
        "print(importlib.util.find_spec('chains'), importlib.util.find_spec('server'))"
    )
    out = run(sys.executable, "-c", probe, cwd=installed.parent, env=env).split("\n")
    assert out[0].startswith(str(installed))
    assert out[1] == "None None"
