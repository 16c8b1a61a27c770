"""The format registry (``retrievers.formats``) and its readers agree: ingest reads every
suffix it lists with the loader of its format, which writes that format's name; the viewer
shows every format and serves every suffix with a media type of its own."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from ragchains.ingest import images
from ragchains.ingest.discovery import discover
from ragchains.ingest.loaders import LOADER_OF_FORMAT, LOADERS, REFUSED, load_file
from ragchains.ingest.parts import LoadOptions
from ragchains.retrievers import formats
from ragchains.retrievers.formats import (
    FORMATS,
    UNKNOWN_MEDIA_TYPE,
    format_named,
    format_names,
    format_of_suffix,
    formats_described,
    media_type,
    media_types,
    suffixes,
    view_of,
)
from ragchains.serving.fileview import TABLE_READERS, build_view
from ragchains.serving.sourcefiles import PAGE_DRAWERS, FileViewBody
from tests.fixtures.make_office import write_docx, write_pptx, write_xlsx
from tests.fixtures.make_pdf import write_pdf

DOCS = Path(__file__).resolve().parent / "fixtures" / "docs"


def test_names_and_suffixes_are_each_one_formats() -> None:
    assert len(set(format_names())) == len(FORMATS)
    listed = [suffix for f in FORMATS for suffix in f.suffixes]
    assert len(set(listed)) == len(listed) == len(suffixes())
    for suffix in listed:
        assert suffix.startswith(".") and suffix == suffix.lower(), suffix
    for f in FORMATS:
        assert format_named(f.name) is f
        assert f.label and f.label_plural and f.suffixes
        for suffix in f.suffixes:
            assert format_of_suffix(suffix) is f
            assert format_of_suffix(suffix.upper()) is f  # HANDBOOK.PDF is a PDF
    assert format_named("rtf") is None and format_of_suffix(".rtf") is None


def test_the_formats_are_described_with_their_suffixes() -> None:
    described = formats_described()
    assert described.startswith("PDFs (.pdf), scanned images (.png, .jpg, .jpeg, .tif, .tiff), ")
    for f in FORMATS:
        assert f"{f.label_plural} ({', '.join(f.suffixes)})" in described


def test_ingest_reads_each_listed_suffix_with_its_formats_loader() -> None:
    assert set(LOADER_OF_FORMAT) == set(format_names())
    assert set(LOADERS) == set(suffixes()) | set(REFUSED)
    assert not set(REFUSED) & set(suffixes())
    for suffix in suffixes():
        found = format_of_suffix(suffix)
        assert found is not None
        assert LOADERS[suffix] is LOADER_OF_FORMAT[found.name], suffix


def test_ingest_takes_up_every_listed_suffix_and_passes_over_others(tmp_path: Path) -> None:
    taken = (*suffixes(), *REFUSED, ".DOCX")  # a refused file is read for its reason
    for suffix in (*taken, ".svg"):
        (tmp_path / f"file{suffix}").write_bytes(b"x")
    found = discover([tmp_path])
    assert sorted(path.suffix for path in found.files.values()) == sorted(taken)
    assert [s.reason for s in found.skipped] == ["unsupported file type '.svg'"]


def test_images_are_read_by_the_signatures_listed() -> None:
    """Every kind of image the image format names, by its bytes or its suffixes, has a reader
    in ingest, chosen by the file's first bytes."""
    image = format_named("image")
    assert image is not None
    by_content = {kind for _, kind in image.signatures}
    assert set(images.IMAGE_CLASSES) == by_content
    assert set(image.media_types.values()) <= by_content
    for signature, kind in image.signatures:
        assert images.image_class(signature + b"rest") is images.IMAGE_CLASSES[kind]
    assert images.image_class(b"GIF89a") is None


def _image(path: Path) -> Path:
    from PIL import Image, ImageDraw, ImageFont

    page = Image.new("L", (900, 200), 255)
    face = ImageFont.load_default(size=48)
    ImageDraw.Draw(page).text((40, 60), "Hedgehogs count at dusk", font=face, fill=0)
    page.save(path, dpi=(300, 300))
    return path


def _copy(name: str) -> Callable[[Path], Path]:
    def copy(path: Path) -> Path:
        return Path(shutil.copy(DOCS / name, path))

    return copy


# One small file of each format, named with one of its suffixes.
WRITERS: dict[str, Callable[[Path], Path]] = {
    "manual.pdf": lambda path: write_pdf(path, ["Pruning roses in March."]),
    "scan.png": _image,
    "guide.md": _copy("guide.md"),
    "page.htm": _copy("page.html"),
    "notes.txt": _copy("notes.txt"),
    "tools.csv": _copy("tools.csv"),
    "plants.jsonl": _copy("plants.jsonl"),
    "handbook.docx": write_docx,
    "deck.pptx": write_pptx,
    "rates.xlsx": write_xlsx,
}


def test_the_fixtures_cover_every_format() -> None:
    covered = {format_of_suffix(Path(name).suffix) for name in WRITERS}
    assert {f.name for f in covered if f is not None} == set(format_names())


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_each_loader_writes_its_formats_name(name: str, tmp_path: Path) -> None:
    if name == "scan.png" and shutil.which("tesseract") is None:
        pytest.skip("OCR engine not installed (tesseract); run make setup")
    path = WRITERS[name](tmp_path / name)
    expected = format_of_suffix(path.suffix)
    assert expected is not None
    assert load_file(path).format == expected.name


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_the_viewer_shows_each_format_as_its_view_says(name: str, tmp_path: Path) -> None:
    path = WRITERS[name](tmp_path / name)
    found = format_of_suffix(path.suffix)
    assert found is not None
    view = build_view("0" * 64, f"corpus/{name}", found.name, path.read_bytes(), LoadOptions())
    body = view.body(row=None, sheet=None, around=1)
    assert body["kind"] == found.view and body["format"] == found.name
    shown = {"pdf": "pages", "image": "page_sizes", "text": "parts", "table": "table"}
    assert body[shown[found.view]], body


def test_the_viewer_shows_every_format() -> None:
    shown = set(FileViewBody.model_json_schema()["properties"]["kind"]["enum"])
    for f in FORMATS:
        assert view_of(f.name) == f.view and f.view in shown, f.name
    tables = {f.name for f in FORMATS if f.view == "table"}
    assert set(TABLE_READERS) == tables
    assert set(PAGE_DRAWERS) == {"pdf", "image"}
    assert view_of("rtf") is None


def test_every_suffix_ingest_reads_is_served_with_its_own_media_type() -> None:
    for suffix in suffixes():
        served = media_type(f"folder/File{suffix.upper()}")
        assert served != UNKNOWN_MEDIA_TYPE and served in media_types(), suffix
    assert media_type("notes.txt") == "text/plain; charset=utf-8"
    assert media_type("old-terms.doc") == UNKNOWN_MEDIA_TYPE
    assert media_type("README") == UNKNOWN_MEDIA_TYPE
    assert UNKNOWN_MEDIA_TYPE in media_types()


def test_an_image_is_served_as_what_its_bytes_are() -> None:
    jpeg = b"\xff\xd8\xff\xe0\x00\x10JFIF"
    assert media_type("scan.png", "image", jpeg) == "image/jpeg"
    assert media_type("scan.tif", "image", b"II*\x00rest") == "image/tiff"
    # Unknown bytes: its name decides; only a format read by content goes by its bytes.
    assert media_type("scan.png", "image", b"GIF89a") == "image/png"
    assert media_type("notes.txt", "text", jpeg) == "text/plain; charset=utf-8"


def test_the_api_names_every_format() -> None:
    from ragchains.chains.retrieve import Source

    described = Source.model_json_schema()["properties"]["format"]["description"]
    assert described.endswith(": " + ", ".join(format_names()))


def test_the_filter_tool_tells_the_model_every_formats_name() -> None:
    """A format filter matches the names chunks have: a model that calls tools is told them
    in add_filter's description. (The rewrite prompt's field list, which every rewrite
    reads, is left as its evaluation measured it.)"""
    from ragchains.chains.toolcalls import FILTER_TOOL, build_tools, describe_fields
    from ragchains.retrievers.filters import BASE_FIELDS

    listed = ", ".join(format_names())
    tools = {tool["function"]["name"]: tool["function"] for tool in build_tools(BASE_FIELDS)}
    assert tools[FILTER_TOOL]["description"].endswith(f"format is one of: {listed}.")
    # An index without the field (a caller's own fields): no formats named.
    others = {"price": "number"}
    assert describe_fields(others) == "price (number)"
    filter_tool = build_tools(others)[-1]["function"]
    assert filter_tool["name"] == FILTER_TOOL and "format" not in filter_tool["description"]


def test_the_registry_imports_only_the_standard_library() -> None:
    """Every reader may import it: chains, ingest, serving and a command's --help."""
    source = Path(formats.__file__).read_text()
    imported = [
        line.split()[1] for line in source.splitlines() if line.startswith(("import ", "from "))
    ]
    assert all(name.split(".")[0] in {"__future__", *_stdlib()} for name in imported), imported


def _stdlib() -> frozenset[str]:
    import sys

    return frozenset(sys.stdlib_module_names)
