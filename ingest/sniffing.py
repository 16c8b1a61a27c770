"""What an uploaded file really is, checked before it is stored and handed to ingestion.

``sniff_upload(path, name)`` returns the format (a name of ``retrievers.formats``: "pdf",
"docx", "image", ...) ingestion will read the staged file at ``path`` as, or raises
``UploadContentError`` with a reason on one line that names the file by ``name``, the name it
was uploaded under. The name's suffix declares the format; the content must agree:

- a PDF has ``%PDF-`` within its first 1024 bytes (pdfium, which ``ingest.pdfs`` reads them
  with, finds the header that far in and no further);
- an image starts with one of the image format's signatures (any of them, whatever the
  image's suffix: ingestion reads images by their content);
- a Word, PowerPoint or Excel file is a zip holding ``[Content_Types].xml`` and the main
  folder of its kind (``word/``, ``ppt/``, ``xl/``), with no part encrypted by a zip password
  and within ``ingest.officezip``'s caps on parts and unzipped bytes; an OLE compound file
  under such a name gets ingestion's own reason (password-protected, or a legacy binary
  file), and so does a zip bomb;
- a text file (Markdown, HTML, text, CSV, JSON) is UTF-8 (a UTF-8 byte-order mark allowed)
  with no NUL byte;
- an empty file is refused, and a file that is some other known thing (a PDF, an image, an
  Office file, a zip, an OLE file, an ELF program) is refused naming what it is, with the
  suffix to rename it to when ingestion reads that kind.

The checks are written here on the format table (``retrievers.formats``, whose image
signatures ingestion reads by) and on ``ingest.officezip``'s checks and wording, rather than
left to a libmagic-style library: such libraries guess text formats poorly (CSV, Markdown,
JSON and plain text are all "text" to them, a short file is often "data"), and they tell an
Office Open XML file from a plain zip, and a document from a workbook, by the names of the
first few parts where the writer happened to put them, when which it is needs the zip's
directory (``[Content_Types].xml`` and the main folder, what ingestion looks for). They
would also add a dependency (libmagic is a C library) whose verdict is not ingestion's:
here a file accepted is one ingestion reads as the format returned, and a refusal reads as
ingestion's would.

It is bounded: it reads the first 64 KiB (``HEAD_BYTES``), a zip's central directory
(``zipfile.ZipFile(...).infolist()``) and, for an OLE file, the compound file's header,
sector table and directory (olefile seeks for them); no part is inflated. What only a parse
finds (an encrypted PDF, an image over the pixel cap, a malformed CSV, an XML bomb inside a
part, text past the first 64 KiB) is left to ingestion, which skips such a file with its
reason. The caller runs it in a worker process under a memory budget: it is a plain
top-level function of a path and a string, returning a string, and its exception pickles.
"""

from __future__ import annotations

import codecs
import zipfile
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from ragchains.ingest.officezip import OLE_MAGIC, check_bounds, ole_reason
from ragchains.ingest.parts import SkipFile
from ragchains.ingest.uploadnames import quoted, suffix_refusal
from ragchains.retrievers.formats import FileFormat, format_named, format_of_suffix

HEAD_BYTES = 64 * 1024
# pdfium looks for the header at each offset from 0 to 1024 (a PDF with 1025 bytes of junk
# before it does not open).
PDF_HEADER = b"%PDF-"
PDF_HEADER_OFFSET = 1024
ELF_MAGIC = b"\x7fELF"
# A zip's first local file header, and the end record that is all of an empty zip.
ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
CONTENT_TYPES = "[Content_Types].xml"
TEXT_FORMATS = frozenset({"markdown", "html", "text", "csv", "json"})
# Each Office format's kind (as its reasons name it) and main folder, as ingest.wordfiles,
# ingest.slides and ingest.sheets open them with ``officezip.open_office``.
OFFICE = {"docx": ("Word", "word"), "pptx": ("PowerPoint", "ppt"), "xlsx": ("Excel", "xl")}
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError)
_ENCRYPTED = 0x1  # bit 0 of a zip entry's general purpose flags


class UploadContentError(ValueError):
    """An upload's content is refused; ``str(exc)`` is the reason, one line, naming the file
    by the name it was uploaded under."""


def _a(label: str) -> str:
    return f"{'an' if label[0] in 'AEIOU' else 'a'} {label}"


def _format(name: str) -> FileFormat:
    found = format_named(name)
    if found is None:  # the table and this module disagree: a bug here, not a bad upload
        raise LookupError(f"no format named {name!r} in retrievers.formats")
    return found


def _image_kind(head: bytes) -> tuple[str, str] | None:
    """("PNG", ".png") for an image the image format reads, by its first bytes."""
    image = _format("image")
    for signature, media_type in image.signatures:
        if head.startswith(signature):
            rename = next(s for s, t in image.media_types.items() if t == media_type)
            return media_type.removeprefix("image/").upper(), rename
    return None


def _image_kinds() -> str:
    """The kinds of image ingestion reads: "PNG, JPEG or TIFF"."""
    signatures = _format("image").signatures
    kinds = list(dict.fromkeys(t.removeprefix("image/").upper() for _, t in signatures))
    return f"{', '.join(kinds[:-1])} or {kinds[-1]}" if len(kinds) > 1 else kinds[0]


def _office_format(entries: list[zipfile.ZipInfo]) -> str | None:
    """The Office format ("docx", ...) of a package with these parts; None: no package."""
    if not any(entry.filename == CONTENT_TYPES for entry in entries):
        return None
    folders = {entry.filename.split("/", 1)[0] for entry in entries}
    return next((name for name, (_, folder) in OFFICE.items() if folder in folders), None)


def _what_it_is(head: bytes, file: BinaryIO) -> tuple[str, str | None] | None:
    """What a file starting with ``head`` is, by its content, and the suffix to rename it to
    when ingestion reads that; None: nothing known."""
    if head.startswith(PDF_HEADER):
        return _a(_format("pdf").label), _format("pdf").suffixes[0]
    image = _image_kind(head)
    if image is not None:
        return f"{_a(image[0])} image", image[1]
    if head.startswith(OLE_MAGIC):
        file.seek(0)
        return _a(ole_reason(file, "Office")), None
    if head.startswith(ELF_MAGIC):
        return "a program (an ELF executable)", None
    if head.startswith(ZIP_MAGIC):
        file.seek(0)
        try:
            with zipfile.ZipFile(file) as archive:
                office = _office_format(archive.infolist())
        except _ZIP_ERRORS:
            office = None
        if office is not None:
            return _a(_format(office).label), _format(office).suffixes[0]
        return "a zip archive", None
    return None


def _refuse_as_other(shown: str, suffix: str, head: bytes, file: BinaryIO) -> None:
    what = _what_it_is(head, file)
    if what is not None:
        description, rename = what
        hint = f"; rename it {rename}" if rename else ""
        raise UploadContentError(f"{shown}: this {suffix} file is {description}{hint}")


def _check_office(
    declared: FileFormat, shown: str, suffix: str, head: bytes, file: BinaryIO
) -> None:
    kind, folder = OFFICE[declared.name]
    label = _a(declared.label)
    if head.startswith(OLE_MAGIC):
        file.seek(0)
        raise UploadContentError(f"{shown}: {ole_reason(file, kind)}")
    file.seek(0)
    try:
        with zipfile.ZipFile(file) as archive:
            entries = archive.infolist()
    except _ZIP_ERRORS as exc:
        if head.startswith(ZIP_MAGIC):  # a zip cut short or damaged, not some other thing
            raise UploadContentError(
                f"{shown}: corrupt {kind} file (not a readable zip archive: {exc})"
            ) from None
        _refuse_as_other(shown, suffix, head, file)
        raise UploadContentError(f"{shown} is not {label} (not a zip archive)") from None
    try:
        check_bounds(entries, kind)
    except SkipFile as exc:
        raise UploadContentError(f"{shown}: {exc}") from None
    encrypted = next((entry for entry in entries if entry.flag_bits & _ENCRYPTED), None)
    if encrypted is not None:
        raise UploadContentError(
            f"{shown}: its part {quoted(encrypted.filename)} is encrypted (a zip password); "
            "save a copy without a password"
        )
    if not any(entry.filename == CONTENT_TYPES for entry in entries):
        raise UploadContentError(
            f"{shown} is not {label}: a zip archive, but no Office Open XML package "
            f"(it has no {CONTENT_TYPES})"
        )
    if folder in {entry.filename.split("/", 1)[0] for entry in entries}:
        return
    other = _office_format(entries)
    if other is not None:
        raise UploadContentError(
            f"{shown}: this {suffix} file is {_a(_format(other).label)}; rename it "
            f"{_format(other).suffixes[0]}"
        )
    raise UploadContentError(f"{shown} is not {label}: its package has no {folder}/ part")


def _check_text(shown: str, suffix: str, head: bytes, whole: bool, file: BinaryIO) -> None:
    for encoding, boms in (
        ("UTF-32", (codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)),
        ("UTF-16", (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)),
    ):
        if head.startswith(boms):
            raise UploadContentError(f"{shown} is {encoding}; save it as UTF-8")
    _refuse_as_other(shown, suffix, head, file)
    nul = head.find(b"\x00")
    if nul != -1:
        raise UploadContentError(f"{shown} is not text: it has a NUL byte (byte {nul:,})")
    skipped = len(codecs.BOM_UTF8) if head.startswith(codecs.BOM_UTF8) else 0
    try:
        # Incremental: the first 64 KiB may end inside a character.
        text = codecs.getincrementaldecoder("utf-8")().decode(head[skipped:], final=whole)
    except UnicodeDecodeError as exc:
        raise UploadContentError(
            f"{shown} is not valid UTF-8 text (byte {exc.start + skipped:,}: {exc.reason}); "
            "save it as UTF-8"
        ) from None
    if whole and not text.strip():
        raise UploadContentError(f"{shown} is empty (nothing but white space)")


def sniff_upload(path: Path, name: str) -> str:
    """The format ingestion will read the file at ``path``, uploaded as ``name``, as (a name
    of ``retrievers.formats``); ``UploadContentError`` with the reason when its content is
    refused. Reads at most its first 64 KiB and, for a zip, its central directory; an
    ``OSError`` reading ``path`` (the server's own staging) is raised as it is."""
    shown = quoted(name)
    suffix = PurePosixPath(name).suffix
    declared = format_of_suffix(suffix)
    if declared is None:
        raise UploadContentError(suffix_refusal(name) or f"{shown}: unsupported file type")
    with path.open("rb") as file:
        head = file.read(HEAD_BYTES)
        whole = len(head) < HEAD_BYTES or not file.read(1)
        if not head:
            raise UploadContentError(f"{shown} is empty")
        if declared.name in OFFICE:
            _check_office(declared, shown, suffix, head, file)
        elif declared.name in TEXT_FORMATS:
            _check_text(shown, suffix, head, whole, file)
        elif declared.name == "pdf":
            if head.find(PDF_HEADER, 0, PDF_HEADER_OFFSET + len(PDF_HEADER)) == -1:
                _refuse_as_other(shown, suffix, head, file)
                raise UploadContentError(
                    f"{shown} is not a PDF (no {PDF_HEADER.decode()} header in its first "
                    f"{PDF_HEADER_OFFSET:,} bytes)"
                )
        elif declared.name == "image":
            if _image_kind(head) is None:
                _refuse_as_other(shown, suffix, head, file)
                raise UploadContentError(
                    f"{shown} is not a {_image_kinds()} image (unrecognised header)"
                )
        else:  # a format added to the table and not here: refused until it is checked
            raise UploadContentError(f"{shown}: {declared.label_plural} cannot be uploaded yet")
    return declared.name
