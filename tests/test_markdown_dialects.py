"""Markdown as mkdocs, Python-Markdown, pymdownx and MyST write it, read as its text."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from ragchains.ingest.markdown import load_markdown, markdown_parts
from ragchains.ingest.parts import LoadOptions, Part
from tests.conftest import FIXTURES

DIALECTS = FIXTURES / "markdown_dialects"
MARKERS = ("{ #", "{#", "///", "!!!", "{*")


def parts(markdown: str) -> list[Part]:
    return markdown_parts(markdown)[1]


def text(markdown: str) -> str:
    return "\n".join(p.text for p in parts(markdown))


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("## Let's Encrypt { #lets-encrypt }", "lets-encrypt"),
        ("## Let's Encrypt {#lets-encrypt}", "lets-encrypt"),
        ("## Let's Encrypt {: #lets-encrypt .wide }", "lets-encrypt"),
        ('## Let\'s Encrypt { #lets-encrypt data-toc-label="LE" }', "lets-encrypt"),
        ("## Let's Encrypt { .wide }", "lets-encrypt"),
    ],
)
def test_a_heading_attribute_list_gives_the_anchor_and_leaves_the_title(
    heading: str, anchor: str
) -> None:
    (part,) = parts(f"{heading}\n\nBody.")
    assert (part.section, part.anchor) == ("Let's Encrypt", anchor)
    assert part.text.splitlines()[0].rstrip() == "## Let's Encrypt"


def test_a_myst_target_names_the_next_heading() -> None:
    (part,) = parts("(my-label)=\n## Setting up\n\nBody.")
    assert (part.section, part.anchor) == ("Setting up", "my-label")
    assert "(my-label)=" not in part.text
    (odd,) = parts("(Odd Label!)=\n## Odd\n\nBody.")
    assert odd.anchor == "odd-label"


def test_python_markdown_admonitions_keep_their_title_and_body() -> None:
    body = text('# T\n\n!!! note "Mind it"\n    Cover the beds.\n\n???+ warning\n    Hot.\n')
    assert "!!!" not in body and "???" not in body
    assert "Mind it" in body and "Cover the beds." in body and "Hot." in body


def test_pymdownx_blocks_nested_keep_titles_and_bodies() -> None:
    body = text("# T\n\n//// details | Outer\nA.\n\n/// tip | Inner\nB.\n///\n////\n")
    assert "///" not in body
    assert all(word in body for word in ("Outer", "A.", "Inner", "B."))


def test_myst_directives_keep_bodies_without_options() -> None:
    body = text("# T\n\n```{note}\n:class: x\nA.\n```\n\n::::{tip}\n:name: y\nB.\n::::\n")
    assert "{note}" not in body and ":class:" not in body and ":name:" not in body
    assert "A." in body and "B." in body


def test_myst_code_directives_stay_code_and_includes_go() -> None:
    body = text(
        "# T\n\n```{code-block} python\n:linenos:\n    x = 1\n```\n\n"
        "```{literalinclude} a.py\n```\n\n```{include} b.md\n```\n\n```{eval-rst}\nRST.\n```\n"
    )
    assert "```python\n    x = 1\n```" in body
    assert "literalinclude" not in body and "include" not in body and "RST." in body


def test_include_and_snippet_lines_and_comments_are_left_out() -> None:
    body = text(
        '# T\n\n{* ../x.py hl[3] *}\n--8<-- "f.md"\n{!f.md!}\n<!-- hidden -->\n'
        "::: pkg.mod\n    options:\n      a: 1\n\nKept.\n"
    )
    assert body.splitlines()[-1] == "Kept."
    assert not any(m in body for m in ("{*", "--8<--", "{!", "hidden", ":::", "options"))


def test_myst_roles_become_their_text_and_links_stay() -> None:
    body = text("# T\n\nSee {ref}`the guide <guide>`, {doc}`intro`, {term}`x` and [a](b.md).")
    assert "See the guide, intro, x and [a](b.md)." in body


def test_front_matter_gives_the_title(tmp_path: Path) -> None:
    for name, head in [
        ("yaml.md", "---\ntitle: Yaml Title\nmyst:\n  html_meta:\n    a: b\n---\n"),
        ("toml.md", '+++\ntitle = "Toml Title"\n+++\n'),
    ]:
        path = tmp_path / name
        path.write_text(head + "# Heading\n\nBody.\n")
        loaded = load_markdown(path, LoadOptions())
        assert loaded.title in ("Yaml Title", "Toml Title")
        assert "title" not in loaded.parts[0].text


def test_a_page_that_only_includes_another_is_skipped_saying_so(tmp_path: Path) -> None:
    from ragchains.ingest.parts import SkipFile

    for name, body in [
        ("snippet.md", '--8<-- "CONTRIBUTING.md"\n'),
        ("myst.md", "```{include} ../../CHANGELOG.md\n:relative-docs: docs/\n```\n"),
    ]:
        path = tmp_path / name
        path.write_text(body)
        with pytest.raises(SkipFile, match=r"include lines .* ingest it itself"):
            load_markdown(path, LoadOptions())


def test_code_fences_are_verbatim_and_do_not_split() -> None:
    (part,) = parts("# T\n\n````md\n```\n## Not a heading {#x}\n!!! note\n```\n````\n")
    assert "````md\n```\n## Not a heading {#x}\n!!! note\n```\n````" in part.text
    assert part.section == "T"


def test_hostile_nesting_and_blank_runs_read_as_text_without_overflowing() -> None:
    """Thousands of nested admonitions and blocks (each level re-reads what it holds) and
    indentation thousands of blanks wide: read, the deepest levels as text, never a
    RecursionError (it took minutes and gigabytes before the depth was bounded)."""
    admonitions = (
        "\n".join("    " * i + "!!! note" for i in range(1500)) + "\n" + " " * 6000 + "body"
    )
    blocks = "\n".join("/" * (3 + i) + " tip" for i in range(1500)) + "\nthe core\n"
    for text, kept in ((admonitions, "body"), (blocks, "the core")):
        _, parts = markdown_parts(text)
        assert kept in "\n".join(p.text for p in parts)
    _, parts = markdown_parts("```\n" * 5001)  # 2,500 empty code blocks and an open one
    assert len(parts) == 1 and parts[0].text.count("```") == 5001


def test_plain_markdown_reads_as_before() -> None:
    found = parts("# A\n\nOne.\n\n## B\n\nTwo.\n")
    assert [(p.section, p.anchor) for p in found] == [("A", "a"), ("A > B", "b")]


@pytest.mark.parametrize("name", sorted(p.name for p in DIALECTS.glob("*.md")))
def test_fixtures_have_no_marker_in_titles_or_line_starts(name: str) -> None:
    loaded = load_markdown(DIALECTS / name, LoadOptions())
    for part in loaded.parts:
        for label in (loaded.title, part.section or "", part.anchor):
            assert not any(m in label for m in MARKERS), label
        in_code = False
        for line in part.text.splitlines():
            if line.lstrip().startswith(("```", "~~~")):
                in_code = not in_code
            elif not in_code:
                assert not line.lstrip().startswith(MARKERS), line


@pytest.mark.e2e
def test_ragchains_ingest_stores_clean_sections(tmp_path: Path) -> None:
    from tests.test_cli import run

    index = tmp_path / "index"
    result = run("ingest", DIALECTS, "--index", index, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["added"] == 3
    labels = []
    for db in index.rglob("*.sqlite*"):
        with sqlite3.connect(db) as conn:
            for (table,) in conn.execute("select name from sqlite_master where type='table'"):
                for row in conn.execute(f"select * from {table}"):
                    labels.extend(str(v) for v in row if isinstance(v, str))
    stored = "\n".join(labels) or "\n".join(
        p.read_text(errors="ignore") for p in index.rglob("*") if p.is_file()
    )
    assert "lets-encrypt" in stored and "compost-basics" in stored
    for marker in ("{ #", "{#lets", "{*", "!!! note", "/// tip"):
        assert marker not in stored
