"""Prompt files: validation at load time, and domain / version selection."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from ragchains.prompts.registry import (
    PROMPTS_DIR,
    PromptFileError,
    PromptRegistry,
    PromptSelectionError,
)

REQUIRED = ("rewrite", "answer", "requery")

GOOD = """\
name: answer
version: 3
description: test prompt
input_variables: [question, context]
messages:
  - role: system
    content: "Sources: {context}"
  - role: history
  - role: human
    content: "{question}"
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "prompts"
    shutil.copytree(PROMPTS_DIR, root, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return root


def test_shipped_prompts_load_and_cover_every_domain() -> None:
    registry = PromptRegistry(required=REQUIRED)
    assert {"default", "hr", "catalog"} <= set(registry.domains)
    for domain in registry.domains:
        for name in REQUIRED:
            prompt = registry.get(domain, name)
            assert prompt.ref.endswith(f"{name}@v{prompt.version}")
    hr = registry.domain("hr")
    assert hr.glossary["PTO"] == "paid time off" and hr.expand_glossary
    assert registry.domain("catalog").multi_query == 2


def test_selection_latest_explicit_and_inherited() -> None:
    registry = PromptRegistry(required=REQUIRED)
    assert registry.get("hr", "rewrite").ref == "hr/rewrite@v3"  # latest
    assert registry.get("hr", "rewrite", 1).ref == "hr/rewrite@v1"
    assert registry.get("hr", "rewrite", "v1").ref == "hr/rewrite@v1"
    assert registry.get("hr", "rewrite", {"rewrite": 1, "answer": 1}).ref == "hr/rewrite@v1"
    assert registry.get("hr", "answer", {"rewrite": 1}).ref == "hr/answer@v2"  # unnamed: latest
    assert registry.get(None, "answer").ref == "default/answer@v2"
    assert registry.get("hr", "requery").ref == "default/requery@v2"  # inherited


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("legal", "answer", None), "unknown domain 'legal'; available: catalog, default, hr"),
        (("hr", "rewrite", 7), "prompt hr/rewrite has no version 7; available: v1, v2"),
        (("hr", "rewrite", "newest"), "prompt hr/rewrite has no version 'newest'; available"),
        (("hr", "summarise", None), "no prompt 'summarise' in domain 'hr'"),
    ],
)
def test_selection_errors(args: tuple, message: str) -> None:
    with pytest.raises(PromptSelectionError, match=re.escape(message)):
        PromptRegistry(required=REQUIRED).get(*args)


@pytest.mark.parametrize(
    ("relpath", "text", "message"),
    [
        (
            "hr/answer/v3.yaml",
            GOOD.replace("[question, context]", "[question]"),
            "used but not declared: context",
        ),
        (
            "hr/answer/v3.yaml",
            GOOD.replace("[question, context]", "[question, context, tone]"),
            "declared but not used: tone",
        ),
        (
            "hr/answer/v3.yaml",
            GOOD.replace("description: test prompt\n", ""),
            "description: Field required",
        ),
        ("hr/answer/v3.yaml", GOOD + "temperature: 0.2\n", "temperature: Extra inputs"),
        (
            "hr/answer/v3.yaml",
            GOOD.replace("version: 3", "version: 4"),
            "version 4 does not match the file name",
        ),
        (
            "hr/answer/v3.yaml",
            GOOD.replace("name: answer", "name: reply"),
            "name 'reply' does not match its folder",
        ),
        ("hr/answer/v1.yml", GOOD.replace("version: 3", "version: 1"), "duplicate version 1"),
        ("hr/answer/latest.yaml", GOOD, "prompt files are named v<N>.yaml"),
        ("hr/answer/v3.yaml", "name: [unclosed", "cannot be read as YAML"),
        ("hr/answer/v3.yaml", GOOD.replace("{context}", "{context"), "does not parse"),
        (
            "hr/answer/v3.yaml",
            GOOD + "model_parameters:\n  temperature: 9\n",
            "model_parameters.temperature",
        ),
    ],
)
def test_invalid_files_fail_at_load_naming_the_file(
    tree: Path, relpath: str, text: str, message: str
) -> None:
    path = tree / relpath
    path.write_text(text)
    with pytest.raises(PromptFileError, match=re.escape(message)) as info:
        PromptRegistry(tree, required=REQUIRED)
    assert str(info.value).startswith(str(path))


def test_domain_and_required_prompt_checks(tree: Path) -> None:
    (tree / "hr" / "domain.yaml").unlink()
    with pytest.raises(PromptFileError, match=r"domain\.yaml is missing"):
        PromptRegistry(tree)
    shutil.rmtree(tree / "hr")
    shutil.rmtree(tree / "default" / "requery")
    with pytest.raises(PromptFileError, match="the required prompt 'requery' is missing"):
        PromptRegistry(tree, required=REQUIRED)


def test_few_shots_are_literal_and_placed(tree: Path) -> None:
    registry = PromptRegistry(required=REQUIRED)
    messages = registry.get("catalog", "rewrite").template.format_messages(
        question="cheap gateways", fields="price (number)"
    )
    assert messages[0].type == "system" and "price (number)" in messages[0].content
    assert [m.type for m in messages[1:]] == ["human", "ai", "human"]
    assert "add_filter(field='price'" in messages[2].content
    assert messages[-1].content == "cheap gateways"


# ----------------------------------------------------------------------------- suggestions
SUGGESTED = """\
name: suggestions
version: 2
description: test questions
questions:
  - How many PTO days do I get?
  - What does the standard plan cost?
"""


def test_shipped_domains_suggest_questions_versioned_like_prompts() -> None:
    registry = PromptRegistry(required=REQUIRED)
    for name in ("default", "hr", "catalog"):
        found = registry.suggestions(name)
        assert found is not None and found.ref == f"{name}/suggestions@v1"
        assert 3 <= len(found.questions) <= 4 and found.description
        assert all(q.endswith("?") for q in found.questions)
        # Not a prompt: never offered as one, nor counted as one a domain overrides.
        assert "suggestions" not in registry.domain(name).prompts
    assert registry.suggestions(None) == registry.suggestions("default")


def test_suggestions_versions_and_a_domain_without_them(tree: Path) -> None:
    (tree / "hr" / "suggestions" / "v2.yaml").write_text(SUGGESTED)
    shutil.rmtree(tree / "catalog" / "suggestions")
    registry = PromptRegistry(tree, required=REQUIRED)
    latest = registry.suggestions("hr")
    assert latest is not None and latest.ref == "hr/suggestions@v2"
    assert latest.questions == ("How many PTO days do I get?", "What does the standard plan cost?")
    assert registry.suggestions("hr", "v1").ref == "hr/suggestions@v1"  # type: ignore[union-attr]
    # Another domain's questions would not be about its documents: none, not default's.
    assert registry.suggestions("catalog") is None
    with pytest.raises(PromptSelectionError, match="hr/suggestions has no version 'v9'"):
        registry.suggestions("hr", "v9")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (SUGGESTED.replace("version: 2", "version: 3"), "version 3 does not match the file name"),
        (SUGGESTED.replace("name: suggestions", "name: questions"), "name: Input should be"),
        (SUGGESTED.replace("description: test questions\n", ""), "description: Field required"),
        (SUGGESTED + "  - How many PTO days do I get?\n", "a question is listed twice"),
        (SUGGESTED + "  - '   '\n", "questions.2: a question is one line of text"),
        (SUGGESTED + "  - " + "x" * 201 + "\n", "questions.2: longer than 200 characters"),
        (SUGGESTED + "".join(f"  - Q{n}?\n" for n in range(7)), "questions: List should have"),
        (SUGGESTED.split("questions:")[0] + "questions: []\n", "questions: List should have"),
        (SUGGESTED + "answer_style: quote\n", "answer_style: Extra inputs"),
    ],
)
def test_invalid_suggestions_fail_at_load_naming_the_file(
    tree: Path, text: str, message: str
) -> None:
    path = tree / "hr" / "suggestions" / "v2.yaml"
    path.write_text(text)
    with pytest.raises(PromptFileError, match=re.escape(message)) as info:
        PromptRegistry(tree, required=REQUIRED)
    assert str(info.value).startswith(str(path))
