"""File loaders: each turns one file into titled parts (pages or sections; table rows in
``ingest.tables``), and ``load_file`` picks the loader by the file's suffix: the format
``retrievers.formats`` reads it as, and that format's loader here.

A loader either returns a ``LoadedFile`` or raises ``SkipFile`` with a reason a person can act
on ("encrypted PDF (password required)", "binary file", ...). Nothing here writes anything.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ragchains.ingest.images import load_image
from ragchains.ingest.markdown import load_markdown
from ragchains.ingest.markdown import markdown_parts as _markdown_parts
from ragchains.ingest.officezip import refuse_legacy
from ragchains.ingest.parts import (
    LoadedFile,
    LoadOptions,
    Part,
    SkipFile,
    read_text,
)
from ragchains.ingest.pdfs import load_pdf
from ragchains.ingest.sheets import load_xlsx
from ragchains.ingest.slides import load_pptx
from ragchains.ingest.tables import load_csv, load_json
from ragchains.ingest.wordfiles import load_docx
from ragchains.retrievers.formats import FORMATS


# ----------------------------------------------------------------------------- formats
def load_text(path: Path, options: LoadOptions) -> LoadedFile:
    text = read_text(path)
    return LoadedFile(format="text", title=path.stem, parts=[Part(text=text)])


def load_html(path: Path, options: LoadOptions) -> LoadedFile:
    import trafilatura

    html = read_text(path)
    # Markdown output keeps the headings, so sections survive as they do for .md files;
    # trafilatura drops navigation, headers, footers and other boilerplate.
    markdown = trafilatura.extract(
        html,
        output_format="markdown",
        include_tables=True,
        include_links=False,
        include_images=False,
        include_comments=False,
        favor_recall=True,
    )
    if not markdown or not markdown.strip():
        raise SkipFile("no main text found in the HTML")
    metadata = trafilatura.extract_metadata(html)
    heading_title, parts = _markdown_parts(markdown)
    title = (metadata.title if metadata and metadata.title else None) or heading_title or path.stem
    return LoadedFile(format="html", title=title, parts=parts)


Loader = Callable[[Path, LoadOptions], LoadedFile]

# Each format's loader, by the format's name (``retrievers.formats``), which the loader writes
# into what it returns. A macro-enabled file or a template holds the same parts as its format's
# plain files and is read by the same loader; its macros are never run.
LOADER_OF_FORMAT: dict[str, Loader] = {
    "pdf": load_pdf,
    "image": load_image,
    "markdown": load_markdown,
    "html": load_html,
    "text": load_text,
    "csv": load_csv,
    "json": load_json,
    "docx": load_docx,
    "pptx": load_pptx,
    "xlsx": load_xlsx,
}
# Suffixes no format reads but whose files are worth a reason of their own: the legacy binary
# Office formats, named with the format to save them as.
REFUSED: dict[str, Loader] = {
    ".doc": refuse_legacy("Word", ".docx"),
    ".ppt": refuse_legacy("PowerPoint", ".pptx"),
    ".xls": refuse_legacy("Excel", ".xlsx"),
}
# The loader of each suffix ingest takes up: those of the formats, then those it refuses.
LOADERS: dict[str, Loader] = {
    **{suffix: LOADER_OF_FORMAT[f.name] for f in FORMATS for suffix in f.suffixes},
    **REFUSED,
}


def load_file(path: Path, options: LoadOptions | None = None) -> LoadedFile:
    loader = LOADERS.get(path.suffix.lower())
    if loader is None:
        raise SkipFile(f"unsupported file type {path.suffix or '(no extension)'!r}")
    return loader(path, options or LoadOptions())
