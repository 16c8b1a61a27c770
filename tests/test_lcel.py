"""The product is built from LangChain as LangChain ships it (issue 24): no private name of a
``langchain*`` package is imported or overridden, and no runnable of ours re-implements how
runnables run (invoke, stream, transform, batch): stages are stock runnables.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest
from langchain_core.runnables import Runnable

from tests.conftest import REPO

# What the project ships: the packages at the top of the repository and ragchains/ itself.
PRODUCT = [REPO / name for name in ("chains", "retrievers", "prompts", "ingest", "evaluation")]
PRODUCT += [REPO / "ragchains", REPO / "server.py"]
# The methods that make a runnable run: a class of ours that defines one is a runtime of its own.
RUNTIME = {"invoke", "ainvoke", "stream", "astream", "transform", "atransform", "batch", "abatch"}
# ... and those that stream a run's log and events, or publish what a run may be configured
# with: LangServe calls them; a class of ours that redefines one changes what LangServe serves.
RUNTIME |= {"astream_log", "astream_events", "config_schema", "get_config_jsonschema"}


def product_files() -> list[Path]:
    files = []
    for place in PRODUCT:
        files += [place] if place.is_file() else sorted(place.rglob("*.py"))
    return files


def _private(dotted: str) -> bool:
    return any(part.startswith("_") for part in dotted.split("."))


def private_langchain_names(path: Path) -> list[str]:
    """``from langchain… import _x``, ``import langchain….​_m`` and ``from langchain…._m
    import x`` in ``path``, as ``file:line name``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("langchain"):
            names = [node.module or ""] if _private(node.module or "") else []
            names += [a.name for a in node.names if a.name.startswith("_")]
            found += [f"{path.name}:{node.lineno} {n}" for n in names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("langchain") and _private(alias.name):
                    found.append(f"{path.name}:{node.lineno} {alias.name}")
    return found


def test_no_private_langchain_name_is_imported() -> None:
    files = product_files()
    assert len(files) > 50
    assert [hit for path in files for hit in private_langchain_names(path)] == []


def test_the_check_finds_a_private_import(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text(
        "from langchain_core.tracers._streaming import _StreamingCallbackHandler\n"
        "from langchain_core.runnables.config import ensure_config, _x\n"
        "import langchain_core._api\n",
        encoding="utf-8",
    )
    assert [hit.split(" ")[1] for hit in private_langchain_names(planted)] == [
        "langchain_core.tracers._streaming",
        "_StreamingCallbackHandler",
        "_x",
        "langchain_core._api",
    ]


def _product_modules() -> list[str]:
    """Every module the project ships, by its one import name."""
    names = []
    for path in product_files():
        relative = path.relative_to(REPO).with_suffix("")
        parts = [p for p in relative.parts if p != "ragchains"]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(["ragchains", *parts]))
    return names


@pytest.mark.parametrize("module_name", sorted(set(_product_modules())))
def test_no_runnable_of_ours_runs_itself(module_name: str) -> None:
    """A class of ours that is a Runnable defines none of the methods that run one (LangChain
    contracts — chat models, retrievers, compressors — implement their own hooks instead)."""
    module = importlib.import_module(module_name)
    for _, cls in inspect.getmembers(module, inspect.isclass):
        if cls.__module__ != module.__name__ or not issubclass(cls, Runnable):
            continue
        own = RUNTIME & set(vars(cls))
        assert not own, f"{module_name}.{cls.__name__} runs itself: {sorted(own)}"


# The frameworks the service runs on: their classes are used as they document them, never
# subclassed from the inside (issue 41). asyncio's and pydantic's are not among them.
FRAMEWORKS = ("uvicorn", "starlette", "fastapi", "langserve", "sse_starlette")


@pytest.mark.parametrize("module_name", sorted(set(_product_modules())))
def test_no_class_of_ours_subclasses_a_servers_internals(module_name: str) -> None:
    module = importlib.import_module(module_name)
    for _, cls in inspect.getmembers(module, inspect.isclass):
        if cls.__module__ != module.__name__:
            continue
        inherited = [base for base in cls.__mro__[1:] if base.__module__.startswith(FRAMEWORKS)]
        assert not inherited, f"{module_name}.{cls.__name__} subclasses {inherited}"


def private_writes(path: Path) -> list[str]:
    """Assignments to another object's private attribute (``request._json = …``) in
    ``path``, as ``file:line target``; an object's own (``self._x``, ``cls._x``) are its
    business."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and target.attr.startswith("_")
                and not target.attr.startswith("__")
                and not (isinstance(target.value, ast.Name) and target.value.id in ("self", "cls"))
            ):
                found.append(f"{path.name}:{node.lineno} {ast.unparse(target)}")
    return found


def test_no_private_attribute_of_another_object_is_written() -> None:
    assert [hit for path in product_files() for hit in private_writes(path)] == []


def test_the_check_finds_a_private_write(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("request._json = body\nself._mine = 1\n", encoding="utf-8")
    assert private_writes(planted) == ["planted.py:1 request._json"]
