"""The name an uploaded file is stored and cited under, checked before anything is written.

The documents API takes a folder of the collection and a file name; ``upload_source`` makes
them one source name (``"hr/policies/leave.pdf"``, the form ``ingest.discovery`` gives the
files it finds) or raises ``UploadNameError`` with the reason, on one line, quoting the value
it refuses (``quoted``: its ``repr``, cut to 100 characters, so a control character or a
right-to-left override shows as an escape and never reaches a log line or a page as itself).
``upload_folder`` checks a folder field alone.

A name is refused when the file could not be stored, listed or ingested under it as given:
control characters, ``.`` and ``..``, hidden names (discovery passes them over), backslashes,
absolute folders and drive letters, names over 255 UTF-8 bytes (what file systems take) or
sources over 1024, and suffixes ingestion does not read (a legacy .doc, .ppt or .xls with the
reason ingestion gives it). Both parts are normalised to NFC first and checked as normalised,
so two spellings of "résumé.pdf" are one source and a name that grows past a limit when
composed is refused. A file name holding ``/`` is refused rather than taken as folders: the
folder is chosen on its own.

It reads no file and no setting: the server's upload route calls it, and it is tested alone.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import PurePosixPath

from ragchains.ingest.officezip import legacy_reason
from ragchains.retrievers.formats import format_of_suffix, suffixes

MAX_NAME_BYTES = 255  # one file or folder name, in UTF-8: what ext4, XFS and APFS take
MAX_SOURCE_BYTES = 1024  # the whole source name, folders and file name, in UTF-8
QUOTED_CHARS = 100  # of a refused value, in a reason

# The legacy binary Office formats ingestion refuses with a reason of their own
# (``ingest.loaders.REFUSED``): the kind and the format to save them as, as it names them.
_LEGACY = {".doc": ("Word", ".docx"), ".ppt": ("PowerPoint", ".pptx"), ".xls": ("Excel", ".xlsx")}
# Control and format characters (NUL, line breaks, tabs, bidirectional overrides, zero-width
# characters), the line and paragraph separators, and lone surrogates (not encodable).
_REFUSED_CATEGORIES = {
    "Cc": "a control character",
    "Cf": "a control character",
    "Zl": "a line break",
    "Zp": "a line break",
    "Cs": "a lone surrogate (not valid Unicode)",
}
_DRIVE = re.compile(r"[A-Za-z]:")


class UploadNameError(ValueError):
    """An upload's folder or file name is refused; ``str(exc)`` is the reason, one line."""


def quoted(value: str) -> str:
    """``value`` as a reason quotes it: its ``repr`` (escapes for anything unprintable), cut
    to ``QUOTED_CHARS`` characters."""
    if len(value) <= QUOTED_CHARS:
        return repr(value)
    return f"{value[:QUOTED_CHARS]!r}…"


def _utf8_bytes(value: str) -> int:
    return len(value.encode("utf-8"))


def _refused_character(value: str) -> str | None:
    for character in value:
        what = _REFUSED_CATEGORIES.get(unicodedata.category(character))
        if what is not None:
            name = unicodedata.name(character, "")
            return f"{what} (U+{ord(character):04X}{' ' + name if name else ''})"
    return None


def suffix_refusal(filename: str) -> str | None:
    """Why ingestion would not read a file named ``filename``, by its suffix; None when it
    reads such files."""
    suffix = PurePosixPath(filename).suffix
    if format_of_suffix(suffix) is not None:
        return None
    legacy = _LEGACY.get(suffix.lower())
    if legacy is not None:
        return f"file name {quoted(filename)}: {legacy_reason(*legacy)}"
    return (
        f"file name {quoted(filename)}: unsupported file type {suffix or '(no extension)'!r} "
        f"(ingestion reads {', '.join(suffixes())})"
    )


def upload_folder(folder: str) -> str:
    """The folder of the collection ``folder`` names, NFC-normalised, with no leading or
    trailing ``/`` ("" is the top level); ``UploadNameError`` with the reason when it is
    refused."""
    if folder == "":
        return ""
    shown = quoted(folder)
    refused = _refused_character(folder)
    if refused is not None:
        raise UploadNameError(f"folder {shown} contains {refused}")
    folder = unicodedata.normalize("NFC", folder)
    shown = quoted(folder)
    if "\\" in folder:
        raise UploadNameError(
            f"folder {shown} may not contain a backslash; separate folders by '/'"
        )
    if folder.startswith("/"):
        raise UploadNameError(
            f"folder {shown} is absolute (starts with '/'); name it from the collection's top"
        )
    if _DRIVE.match(folder):
        raise UploadNameError(f"folder {shown} may not start with a drive ({folder[:2]!r})")
    folder = folder.rstrip("/")
    for part in folder.split("/"):
        if part == "":
            raise UploadNameError(f"folder {shown} has an empty part ('//')")
        if not part.strip():
            raise UploadNameError(f"folder {shown} has a blank part ({quoted(part)})")
        if part in (".", ".."):
            raise UploadNameError(f"folder {shown} may not have a {part!r} part")
        if part.startswith("."):
            raise UploadNameError(
                f"folder {shown} has a part starting with '.' ({quoted(part)}): ingestion "
                "passes hidden folders over"
            )
        size = _utf8_bytes(part)
        if size > MAX_NAME_BYTES:
            raise UploadNameError(
                f"folder {shown} has a part of {size:,} bytes in UTF-8 ({quoted(part)}), over "
                f"the limit of {MAX_NAME_BYTES} for one name"
            )
    size = _utf8_bytes(folder)
    if size > MAX_SOURCE_BYTES:
        raise UploadNameError(
            f"folder {shown} is {size:,} bytes in UTF-8, over the limit of {MAX_SOURCE_BYTES:,}"
        )
    return folder


def _checked_filename(filename: str) -> str:
    if not filename.strip():
        raise UploadNameError(
            "a file name is required" if not filename else f"file name {quoted(filename)} is blank"
        )
    refused = _refused_character(filename)
    if refused is not None:
        raise UploadNameError(f"file name {quoted(filename)} contains {refused}")
    filename = unicodedata.normalize("NFC", filename)
    shown = quoted(filename)
    if "/" in filename:
        raise UploadNameError(f"file name {shown} may not contain '/': choose the folder instead")
    if "\\" in filename:
        raise UploadNameError(f"file name {shown} may not contain a backslash")
    if _DRIVE.match(filename):
        raise UploadNameError(f"file name {shown} may not start with a drive ({filename[:2]!r})")
    if filename in (".", ".."):
        raise UploadNameError(f"file name {shown} may not be '.' or '..'")
    if filename.startswith("."):
        raise UploadNameError(
            f"file name {shown} starts with '.': ingestion passes hidden files over"
        )
    size = _utf8_bytes(filename)
    if size > MAX_NAME_BYTES:
        raise UploadNameError(
            f"file name {shown} is {size:,} bytes in UTF-8, over the limit of {MAX_NAME_BYTES} "
            "for one name"
        )
    refused = suffix_refusal(filename)
    if refused is not None:
        raise UploadNameError(refused)
    return filename


def upload_source(folder: str, filename: str) -> str:
    """The source name of a file uploaded as ``filename`` into ``folder`` ("" for the top
    level, "hr/policies" for a folder in a folder): ``"<folder>/<filename>"``, posix, NFC,
    no leading or trailing ``/``. Raises ``UploadNameError`` with the reason when either is
    refused."""
    folder = upload_folder(folder)
    filename = _checked_filename(filename)
    source = f"{folder}/{filename}" if folder else filename
    size = _utf8_bytes(source)
    if size > MAX_SOURCE_BYTES:
        raise UploadNameError(
            f"source name {quoted(source)} is {size:,} bytes in UTF-8, over the limit of "
            f"{MAX_SOURCE_BYTES:,}"
        )
    return source
