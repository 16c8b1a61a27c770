"""Opening an Office Open XML file (.docx, .pptx, .xlsx) safely, before its library reads it.

These files are zip archives. A password-protected one is not: it is an OLE compound file
holding the encrypted package, as are the legacy binary formats (.doc, .ppt, .xls) renamed.
A zip bomb declares sizes it would decompress to; ``zipfile`` never inflates an entry past its
declared size (the CRC check fails first), so capping the declared total and the number of
parts bounds what any library can read from the archive.

Nothing here runs macros or follows external links: the libraries only read the XML parts.

A Strict package (ISO/IEC 29500 Strict, "Strict Open XML" in Office's Save As) names its
XML and relationships with ``http://purl.oclc.org/ooxml/...`` URIs that python-docx,
python-pptx and openpyxl do not know: they would read such a file as empty. It is
translated to the Transitional names in memory first (``_transitional``), the pairing the
Open XML SDK reads Strict files by.
"""

from __future__ import annotations

import io
import re
import shutil
import zipfile
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from ragchains.ingest.parts import LoadedFile, LoadOptions, SkipFile, read_bytes

# A large deck of photographs unzips to a few hundred MB; parts are counted in hundreds.
MAX_UNZIPPED_BYTES = 512 * 1024 * 1024
MAX_PARTS = 5000

# The first bytes of an OLE compound file: a password-protected or legacy Office file.
OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
_MODERN = {"word": ".docx", "ppt": ".pptx", "xl": ".xlsx"}


# Strict names and their Transitional equivalents, as the Open XML SDK pairs them, for every
# namespace these libraries read.
_STRICT = "http://purl.oclc.org/ooxml/"
_TRANSITIONAL = "http://schemas.openxmlformats.org/"
_NAMESPACES = {
    f"{_STRICT}{strict}": f"{_TRANSITIONAL}{transitional}"
    for strict, transitional in {
        "wordprocessingml/main": "wordprocessingml/2006/main",
        "spreadsheetml/main": "spreadsheetml/2006/main",
        "presentationml/main": "presentationml/2006/main",
        "drawingml/main": "drawingml/2006/main",
        "drawingml/chart": "drawingml/2006/chart",
        "drawingml/chartDrawing": "drawingml/2006/chartDrawing",
        "drawingml/diagram": "drawingml/2006/diagram",
        "drawingml/picture": "drawingml/2006/picture",
        "drawingml/lockedCanvas": "drawingml/2006/lockedCanvas",
        "drawingml/compatibility": "drawingml/2006/compatibility",
        "drawingml/wordprocessingDrawing": "drawingml/2006/wordprocessingDrawing",
        "drawingml/spreadsheetDrawing": "drawingml/2006/spreadsheetDrawing",
        "officeDocument/relationships": "officeDocument/2006/relationships",
        "officeDocument/math": "officeDocument/2006/math",
        "officeDocument/sharedTypes": "officeDocument/2006/sharedTypes",
        "officeDocument/bibliography": "officeDocument/2006/bibliography",
        "officeDocument/customXml": "officeDocument/2006/customXml",
        "officeDocument/customXmlDataProps": "officeDocument/2006/customXmlDataProps",
        "officeDocument/docPropsVTypes": "officeDocument/2006/docPropsVTypes",
        "officeDocument/extendedProperties": "officeDocument/2006/extended-properties",
        "officeDocument/customProperties": "officeDocument/2006/custom-properties",
        "schemaLibrary/main": "schemaLibrary/2006/main",
        # A slip in the ISO schemas the SDK works around: this namespace (not the
        # relationship type of the same name) is the custom XML one.
        "officeDocument/relationships/customXml": "officeDocument/2006/customXml",
    }.items()
}
_STRICT_RELATIONSHIP = f"{_STRICT}officeDocument/relationships/"
# Relationship types keep their name but for these three.
_RELATIONSHIPS = {
    f"{_STRICT_RELATIONSHIP}extendedProperties": (
        f"{_TRANSITIONAL}officeDocument/2006/relationships/extended-properties"
    ),
    f"{_STRICT_RELATIONSHIP}customProperties": (
        f"{_TRANSITIONAL}officeDocument/2006/relationships/custom-properties"
    ),
    f"{_STRICT_RELATIONSHIP}metadata/thumbnail": (
        f"{_TRANSITIONAL}package/2006/relationships/metadata/thumbnail"
    ),
}
# A Strict URI as a whole attribute value (a namespace declaration or a relationship's Type),
# never a run of text that happens to quote one.
_STRICT_URI = re.compile(
    rb"""(?<=["'])http://purl\.oclc\.org/ooxml/[A-Za-z0-9/._-]{1,100}(?=["'])"""
)
_XML_PARTS = (".xml", ".rels", ".vml")


def _transitional_uri(uri: str, relationships: bool) -> str:
    if relationships and uri.startswith(_STRICT_RELATIONSHIP):
        name = uri[len(_STRICT_RELATIONSHIP) :]
        default = f"{_TRANSITIONAL}officeDocument/2006/relationships/{name}"
        return _RELATIONSHIPS.get(uri, default)
    return _NAMESPACES.get(uri, uri)


def _translate(xml: bytes, relationships: bool) -> bytes:
    # UTF-8, as every Office application writes these parts; a UTF-16 part is left as it
    # is (its library then reads it as before: as empty).
    return _STRICT_URI.sub(
        lambda match: _transitional_uri(match.group().decode(), relationships).encode(), xml
    )


# The main part's content type of a macro-enabled file (.docm, .pptm, .xlsm) or a template,
# and that of the plain document: python-docx and python-pptx refuse any other type, though
# the parts they read are the same (a macro is a binary part no library here runs).
_PLAIN_MAIN = {
    b"application/vnd.ms-word.document.macroEnabled.main+xml": b"application/vnd."
    b"openxmlformats-officedocument.wordprocessingml.document.main+xml",
    b"application/vnd.ms-word.template.macroEnabledTemplate.main+xml": b"application/vnd."
    b"openxmlformats-officedocument.wordprocessingml.document.main+xml",
    b"application/vnd.openxmlformats-officedocument.wordprocessingml.template.main+xml": b"appl"
    b"ication/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml",
    b"application/vnd.ms-powerpoint.presentation.macroEnabled.main+xml": b"application/vnd."
    b"openxmlformats-officedocument.presentationml.presentation.main+xml",
    b"application/vnd.ms-powerpoint.slideshow.macroEnabled.main+xml": b"application/vnd."
    b"openxmlformats-officedocument.presentationml.presentation.main+xml",
    b"application/vnd.openxmlformats-officedocument.presentationml.slideshow.main+xml": b"appl"
    b"ication/vnd.openxmlformats-officedocument.presentationml.presentation.main+xml",
    b"application/vnd.ms-excel.sheet.macroEnabled.main+xml": b"application/vnd."
    b"openxmlformats-officedocument.spreadsheetml.sheet.main+xml",
}
_CONTENT_TYPES = "[Content_Types].xml"


def _plain_content_types(xml: bytes) -> bytes:
    for special, plain in _PLAIN_MAIN.items():
        xml = xml.replace(special, plain)
    return xml


def _needs_plain_types(archive: zipfile.ZipFile) -> bool:
    try:
        types = archive.read(_CONTENT_TYPES)
    except (KeyError, zipfile.BadZipFile, OSError, RuntimeError, ValueError, EOFError):
        return False
    return any(special in types for special in _PLAIN_MAIN)


def _is_strict(archive: zipfile.ZipFile) -> bool:
    try:
        with archive.open("_rels/.rels") as rels:
            head = rels.read(1 << 16)
    except (KeyError, zipfile.BadZipFile, OSError, RuntimeError, ValueError):
        return False
    return _STRICT_RELATIONSHIP.encode() in head


def _transitional(archive: zipfile.ZipFile, strict: bool = True) -> io.BytesIO:
    """The package again with its Strict names translated (when ``strict``) and its main
    part typed as a plain document. Each XML part is read whole (the caller has capped the
    declared sizes); media are streamed across as they are."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as copy:
        for entry in archive.infolist():
            target = zipfile.ZipInfo(entry.filename, entry.date_time)
            target.external_attr = entry.external_attr
            name = entry.filename.lower()
            if name.endswith(_XML_PARTS):
                target.compress_type = zipfile.ZIP_DEFLATED
                xml = archive.read(entry)
                if strict:
                    xml = _translate(xml, name.endswith(".rels"))
                if entry.filename == _CONTENT_TYPES:
                    xml = _plain_content_types(xml)
                copy.writestr(target, xml, compresslevel=1)
            else:
                target.compress_type = entry.compress_type
                target.file_size = entry.file_size
                with archive.open(entry) as source, copy.open(target, "w") as sink:
                    shutil.copyfileobj(source, sink, 1 << 20)
    out.seek(0)
    return out


def ole_reason(data: bytes | IO[bytes], kind: str) -> str:
    """Why an OLE compound file (its bytes, or the file open for reading, which olefile reads
    by seeking: its header, sector table and directory) is not read as a ``kind`` ("Word")
    file: password-protected (encrypted), or a legacy binary file."""
    import olefile

    try:
        with olefile.OleFileIO(io.BytesIO(data) if isinstance(data, bytes) else data) as ole:
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
    if data.startswith(OLE_MAGIC):
        raise SkipFile(ole_reason(data, kind))
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        entries = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError) as exc:
        raise SkipFile(f"corrupt {kind} file (not a readable zip archive: {exc})") from exc
    with archive:
        return _checked(archive, entries, data, kind, folder)


def check_bounds(entries: Sequence[zipfile.ZipInfo], kind: str) -> None:
    """Raise ``SkipFile`` when a zip's central directory (``entries``) declares more than
    ``MAX_PARTS`` parts or more than ``MAX_UNZIPPED_BYTES`` in all (a zip bomb): decided
    before anything is inflated. ``kind`` names the format in the reason ("Word")."""
    if len(entries) > MAX_PARTS:
        raise SkipFile(f"{kind} file has {len(entries):,} parts, over the cap of {MAX_PARTS:,}")
    unzipped = sum(entry.file_size for entry in entries)
    if unzipped > MAX_UNZIPPED_BYTES:
        raise SkipFile(
            f"{kind} file would unzip to {unzipped / 2**20:,.0f} MB, over the cap of "
            f"{MAX_UNZIPPED_BYTES // 2**20} MB (a zip bomb?)"
        )


def _checked(
    archive: zipfile.ZipFile, entries: list[zipfile.ZipInfo], data: bytes, kind: str, folder: str
) -> io.BytesIO:
    check_bounds(entries, kind)
    names = {entry.filename.split("/", 1)[0] for entry in entries}
    if folder not in names:
        other = next((suffix for top, suffix in _MODERN.items() if top in names), None)
        hint = f" (it holds a {other} document)" if other else ""
        article = "an" if kind[0] in "AEIOU" else "a"
        raise SkipFile(f"not {article} {kind} document{hint}")
    strict = _is_strict(archive)
    if strict or _needs_plain_types(archive):
        try:
            return _transitional(archive, strict)
        except (
            zipfile.BadZipFile,  # a CRC that does not match, a truncated entry
            zipfile.LargeZipFile,
            zlib.error,
            EOFError,
            OSError,
            ValueError,
            RuntimeError,  # an entry encrypted with a zip password
            NotImplementedError,  # a compression method zipfile lacks
        ) as exc:
            detail = "Strict Open XML: " if strict else ""
            raise SkipFile(f"corrupt {kind} file ({detail}{exc})") from exc
    return io.BytesIO(data)


def legacy_reason(kind: str, modern: str) -> str:
    """Why a legacy binary ``kind`` file (.doc, .ppt, .xls) is not read, naming the format to
    save it as (``modern``: ".docx")."""
    return f"legacy binary {kind} file; save it as {modern} to have it read"


def refuse_legacy(kind: str, modern: str) -> Callable[[Path, LoadOptions], LoadedFile]:
    """A loader for a legacy binary format (.doc, .ppt, .xls): the reason it is not read,
    naming the format to save it as (or that it is password-protected)."""

    def refuse(path: Path, options: LoadOptions) -> LoadedFile:
        data = read_bytes(path)
        if data.startswith(OLE_MAGIC):
            reason = ole_reason(data, kind)
            if reason.startswith("legacy"):
                reason = legacy_reason(kind, modern)
            raise SkipFile(reason)
        article = "an" if kind[0] in "AEIOU" else "a"
        raise SkipFile(f"not {article} {kind} file (save it as {modern} to have it read)")

    return refuse


def library_failure(kind: str, exc: Exception) -> SkipFile:
    """A reason for what the format's library raised on a damaged file, on one line."""
    seen: BaseException | None = exc
    while seen is not None:
        # defusedxml (openpyxl parses through it) refuses entity declarations: the billion
        # laughs and external-entity attacks; the library then reports a generic failure.
        if type(seen).__module__.startswith("defusedxml"):
            return SkipFile(
                f"{kind} file refused: its XML declares entities (an XML bomb or an external "
                "entity), which are never expanded"
            )
        seen = seen.__cause__ or seen.__context__
    if isinstance(exc, zipfile.BadZipFile):
        return SkipFile(f"corrupt {kind} file ({exc})")
    detail = " ".join(str(exc).split())[:120]
    return SkipFile(f"corrupt {kind} file ({type(exc).__name__}: {detail})")


def part_xml(part: Any) -> Any:
    """An Office part's XML tree: the library's own when it keeps one (python-docx's
    ``element``), else parsed from its bytes with entities, DTDs and the network off."""
    element = getattr(part, "element", None)
    if element is not None:
        return element
    return safe_xml(part.blob)


def safe_xml(data: bytes) -> Any:
    from lxml import etree

    parser = etree.XMLParser(
        resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False
    )
    return etree.fromstring(data, parser)
