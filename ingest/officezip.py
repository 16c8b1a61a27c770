"""Opening an Office Open XML file (.docx, .pptx, .xlsx) safely, before its library reads it.

These files are zip archives. A password-protected one is not: it is an OLE compound file
holding the encrypted package, as are the legacy binary formats (.doc, .ppt, .xls) renamed.
A zip bomb declares sizes it would decompress to; ``zipfile`` never inflates an entry past its
declared size (the CRC check fails first), so capping the declared total and the number of
parts bounds what any library can read from the archive.

Nothing here runs macros or follows external links: the libraries only read the XML parts.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable
from pathlib import Path

from ragchains.ingest.parts import LoadedFile, LoadOptions, SkipFile, read_bytes

# A large deck of photographs unzips to a few hundred MB; parts are counted in hundreds.
MAX_UNZIPPED_BYTES = 512 * 1024 * 1024
MAX_PARTS = 5000

_OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
_MODERN = {"word": ".docx", "ppt": ".pptx", "xl": ".xlsx"}


def _ole_reason(data: bytes, kind: str) -> str:
    import olefile

    try:
        with olefile.OleFileIO(io.BytesIO(data)) as ole:
            encrypted = ole.exists("EncryptionInfo") or ole.exists("EncryptedPackage")
    except Exception:  # olefile raises many kinds on a damaged compound file
        encrypted = False
    if encrypted:
        return f"password-protected {kind} file (encrypted); save a copy without a password"
    return f"legacy binary {kind} file (not Office Open XML); save it in the current format"


def open_office(path: Path, kind: str, folder: str) -> io.BytesIO:
    """The file's bytes, ready for python-docx, python-pptx or openpyxl, once they are known
    to be a bounded zip holding ``folder`` ("word", "ppt", "xl"). ``kind`` names the format
    in reasons ("Word")."""
    data = read_bytes(path)
    if not data.strip():
        raise SkipFile("empty file")
    if data.startswith(_OLE_MAGIC):
        raise SkipFile(_ole_reason(data, kind))
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError) as exc:
        raise SkipFile(f"corrupt {kind} file (not a readable zip archive: {exc})") from exc
    if len(entries) > MAX_PARTS:
        raise SkipFile(f"{kind} file has {len(entries):,} parts, over the cap of {MAX_PARTS:,}")
    unzipped = sum(entry.file_size for entry in entries)
    if unzipped > MAX_UNZIPPED_BYTES:
        raise SkipFile(
            f"{kind} file would unzip to {unzipped / 2**20:,.0f} MB, over the cap of "
            f"{MAX_UNZIPPED_BYTES // 2**20} MB (a zip bomb?)"
        )
    names = {entry.filename.split("/", 1)[0] for entry in entries}
    if folder not in names:
        other = next((suffix for top, suffix in _MODERN.items() if top in names), None)
        hint = f" (it holds a {other} document)" if other else ""
        raise SkipFile(f"not a {kind} document{hint}")
    return io.BytesIO(data)


def refuse_legacy(kind: str, modern: str) -> Callable[[Path, LoadOptions], LoadedFile]:
    """A loader for a legacy binary format (.doc, .ppt, .xls): the reason it is not read,
    naming the format to save it as (or that it is password-protected)."""

    def refuse(path: Path, options: LoadOptions) -> LoadedFile:
        data = read_bytes(path)
        if data.startswith(_OLE_MAGIC):
            reason = _ole_reason(data, kind)
            if reason.startswith("legacy"):
                reason = f"legacy binary {kind} file; save it as {modern} to have it read"
            raise SkipFile(reason)
        raise SkipFile(f"not a {kind} file (save it as {modern} to have it read)")

    return refuse


def library_failure(kind: str, exc: Exception) -> SkipFile:
    """A reason for what the format's library raised on a damaged file."""
    if isinstance(exc, zipfile.BadZipFile):
        return SkipFile(f"corrupt {kind} file ({exc})")
    return SkipFile(f"corrupt {kind} file ({type(exc).__name__}: {str(exc)[:120]})")
