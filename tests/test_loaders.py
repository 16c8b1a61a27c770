"""Each loader on a small fixture: text, structure (page / section / row) and typed metadata."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragchains.ingest.loaders import load_file
from ragchains.ingest.parts import LoadOptions, SkipFile
from tests.fixtures.make_pdf import write_pdf

DOCS = Path(__file__).resolve().parent / "fixtures" / "docs"


def test_pdf_keeps_page_numbers_and_title(tmp_path: Path) -> None:
    pdf = write_pdf(
        tmp_path / "manual.pdf",
        ["Page one talks about pruning roses.", "", "Page three covers winter mulch."],
        title="Garden Manual",
    )
    loaded = load_file(pdf)
    assert loaded.format == "pdf"
    assert loaded.title == "Garden Manual"
    # The empty second page yields no part; numbering still follows the real pages.
    assert [p.page for p in loaded.parts] == [1, 3]
    assert [p.anchor for p in loaded.parts] == ["page=1", "page=3"]
    assert "winter mulch" in loaded.parts[1].text


def test_html_keeps_main_text_and_title_without_navigation() -> None:
    loaded = load_file(DOCS / "page.html")
    text = "\n".join(p.text for p in loaded.parts)
    assert loaded.format == "html"
    assert loaded.title == "Compost basics"
    assert "ratio of about one to three" in text
    assert "smelly compost" in text
    for boilerplate in ("Login", "Shop menu", "Cookie settings"):
        assert boilerplate not in text
    assert [p.section for p in loaded.parts] == [
        "Compost basics",
        "Compost basics > Troubleshooting",
    ]


def test_markdown_keeps_heading_path_as_section() -> None:
    loaded = load_file(DOCS / "guide.md")
    sections = {p.section: p for p in loaded.parts}
    assert loaded.title == "Garden guide"
    assert "Garden guide > Watering > Drip lines" in sections
    drip = sections["Garden guide > Watering > Drip lines"]
    assert "06:00" in drip.text
    assert drip.anchor == "drip-lines"
    assert "4172" in sections["Garden guide > Tools"].text


def test_markdown_front_matter_title(tmp_path: Path) -> None:
    path = tmp_path / "fm.md"
    path.write_text("---\ntitle: 'Front Title'\n---\nBody without headings.\n")
    loaded = load_file(path)
    assert loaded.title == "Front Title"
    assert loaded.parts[0].text.strip() == "Body without headings."


def test_plain_text() -> None:
    loaded = load_file(DOCS / "notes.txt")
    assert loaded.format == "text"
    assert loaded.title == "notes"
    assert "first Saturday of April" in loaded.parts[0].text


def test_csv_rows_have_typed_metadata_and_readable_text() -> None:
    loaded = load_file(DOCS / "tools.csv")
    assert loaded.format == "csv"
    rows = {p.fields["name"]: p for p in loaded.parts}
    spade = rows["Spade"]
    assert spade.row == 1 and spade.anchor == "row=1"
    assert spade.fields["price"] == 24.5  # "$24.50" is a number
    assert spade.fields["electric"] is False
    assert rows["Wheelbarrow"].fields["price"] == 1050  # "1,050"
    assert rows["Hedge trimmer"].fields["electric"] is True
    # The text shows cells as written, so an answer can quote "$24.50".
    assert "price: $24.50" in spade.text
    assert spade.title == "Spade"


def test_csv_text_columns_choose_the_text(tmp_path: Path) -> None:
    loaded = load_file(DOCS / "tools.csv", LoadOptions(text_columns=["name", "notes"]))
    spade = loaded.parts[0]
    assert spade.text == "name: Spade\nnotes: Steel blade, ash handle"
    assert spade.fields["price"] == 24.5  # still filterable
    with pytest.raises(SkipFile, match="none of the text columns"):
        load_file(DOCS / "tools.csv", LoadOptions(text_columns=["nope"]))


def test_jsonl_rows_flatten_nested_objects() -> None:
    loaded = load_file(DOCS / "plants.jsonl")
    rosemary = loaded.parts[1]
    assert rosemary.fields == {
        "name": "Rosemary",
        "family": "Lamiaceae",
        "days_to_harvest": 90,
        "perennial": True,
        "care.sun": "full",
        "care.water": "low",
    }
    assert "care.water: low" in rosemary.text


def test_json_object_holding_one_array() -> None:
    loaded = load_file(DOCS / "beds.json")
    assert [p.fields["bed"] for p in loaded.parts] == ["A1", "B2"]
    assert loaded.parts[1].fields["size_m2"] == 4.5


def test_reserved_column_names_are_renamed(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("source,page,title\nweb,3,Hello\n")
    part = load_file(path).parts[0]
    assert part.fields == {"col_source": "web", "col_page": 3, "col_title": "Hello"}
    assert part.title == "Hello"


def test_long_prose_columns_are_not_filterable(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    long_text = "word " * 40
    path.write_text(f"id,body\n1,{long_text}\n")
    part = load_file(path).parts[0]
    assert "body" not in part.fields
    assert "body: word word" in part.text
