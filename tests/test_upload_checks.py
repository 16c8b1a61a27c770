"""The checks an uploaded file passes before the documents API accepts it: its name and folder
(``ingest.uploadnames``) and its content against its name (``ingest.sniffing``). Every
refusal is made by a real file (or name) and its reason checked; every format ingestion
reads is accepted from a real file; where a reason is ingestion's own, it is checked to be
word for word what ingestion says of the same file."""

from __future__ import annotations

import codecs
import os
import pickle
import shutil
import struct
import sys
import unicodedata
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from ragchains.ingest.loaders import REFUSED, load_file
from ragchains.ingest.officezip import MAX_PARTS, MAX_UNZIPPED_BYTES
from ragchains.ingest.parsing import BudgetedCalls, ParseBudget
from ragchains.ingest.parts import LoadOptions, SkipFile
from ragchains.ingest.sniffing import HEAD_BYTES, UploadContentError, sniff_upload
from ragchains.ingest.uploadnames import (
    MAX_NAME_BYTES,
    MAX_SOURCE_BYTES,
    UploadNameError,
    quoted,
    upload_folder,
    upload_source,
)
from ragchains.retrievers.formats import FORMATS, suffixes
from tests.fixtures.make_office import (
    encrypt_office,
    write_docx,
    write_many_parts,
    write_pptx,
    write_xlsx,
    write_zip_bomb,
)
from tests.fixtures.make_pdf import write_pdf

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "samples"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
ODD = Path(__file__).resolve().parent / "odd_documents"


def name_refusal(folder: str, filename: str) -> str:
    with pytest.raises(UploadNameError) as refused:
        upload_source(folder, filename)
    reason = str(refused.value)
    assert "\n" not in reason and "\r" not in reason
    return reason


def content_refusal(path: Path, name: str) -> str:
    with pytest.raises(UploadContentError) as refused:
        sniff_upload(path, name)
    reason = str(refused.value)
    assert "\n" not in reason and reason.startswith(quoted(name)), reason
    return reason


def ingest_reason(path: Path) -> str:
    with pytest.raises(SkipFile) as skipped:
        load_file(path)
    return str(skipped.value)


def staged(tmp_path: Path, data: bytes, name: str = "upload-0001.part") -> Path:
    """An upload as the server stages it: under a name of its own, not the uploaded one."""
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# ----------------------------------------------------------------------------- names
@pytest.mark.parametrize(
    ("folder", "filename", "source"),
    [
        ("", "report.pdf", "report.pdf"),
        ("hr", "report.pdf", "hr/report.pdf"),
        ("hr/policies", "Leave policy (2025).DOCX", "hr/policies/Leave policy (2025).DOCX"),
        ("hr/policies/", "notes.md", "hr/policies/notes.md"),  # a trailing '/' is dropped
        ("Ventas/Año 2025", "informe final.xlsx", "Ventas/Año 2025/informe final.xlsx"),
        ("", "報告書.pdf", "報告書.pdf"),
        ("a", "v1.2.final.txt", "a/v1.2.final.txt"),
        ("", "scan.TIFF", "scan.TIFF"),
    ],
)
def test_accepted_names_give_the_source_name(folder: str, filename: str, source: str) -> None:
    assert upload_source(folder, filename) == source


@pytest.mark.parametrize("suffix", suffixes())
def test_every_suffix_ingestion_reads_is_accepted(suffix: str) -> None:
    assert upload_source("docs", f"file{suffix}") == f"docs/file{suffix}"
    assert upload_source("docs", f"file{suffix.upper()}") == f"docs/file{suffix.upper()}"


def test_folder_and_name_are_normalised_to_nfc() -> None:
    decomposed = upload_source("Cafe\u0301", "re\u0301sume\u0301.pdf")
    assert decomposed == "Café/résumé.pdf" == upload_source("Café", "résumé.pdf")
    assert unicodedata.is_normalized("NFC", decomposed)
    assert upload_folder("Cafe\u0301/Menu\u0301/") == "Café/Menú"
    assert upload_folder("") == ""
    assert upload_folder("hr/policies") == "hr/policies"


def test_names_at_the_limits_are_accepted_and_one_byte_over_refused() -> None:
    longest = "é" * ((MAX_NAME_BYTES - 4) // 2) + "x.pdf"  # 2 bytes a letter in UTF-8
    assert len(longest.encode()) == MAX_NAME_BYTES
    assert upload_source("", longest) == longest
    assert "is 256 bytes in UTF-8, over the limit of 255" in name_refusal("", "x" + longest)
    folder = "é" * (MAX_NAME_BYTES // 2) + "x"
    assert upload_folder(folder) == folder
    assert "has a part of 257 bytes in UTF-8" in name_refusal(folder + "é", "a.pdf")
    # Four folders of 250 bytes and a name: the whole at the limit, then one byte over.
    folders = "/".join(["f" * 250] * 4)
    filename = "n" * (MAX_SOURCE_BYTES - len(folders) - 1 - 4) + ".pdf"
    assert len(upload_source(folders, filename).encode()) == MAX_SOURCE_BYTES
    reason = name_refusal(folders, "n" + filename)
    assert reason.startswith("source name 'ffff")
    assert reason.endswith("is 1,025 bytes in UTF-8, over the limit of 1,024")
    assert len(reason) < 250  # the value is quoted cut to 100 characters
    too_long = "/".join(["f" * 255] * 4) + "/ff"
    assert name_refusal(too_long, "a.md").endswith(
        "is 1,026 bytes in UTF-8, over the limit of 1,024"
    )
    assert name_refusal(too_long, "a.md").startswith("folder 'fff")


@pytest.mark.parametrize(
    ("filename", "reason"),
    [
        ("", "a file name is required"),
        ("   ", "file name '   ' is blank"),
        ("report\x00.pdf", "file name 'report\\x00.pdf' contains a control character (U+0000)"),
        ("report\n.pdf", "file name 'report\\n.pdf' contains a control character (U+000A)"),
        ("report\r.pdf", "file name 'report\\r.pdf' contains a control character (U+000D)"),
        ("report\t.pdf", "file name 'report\\t.pdf' contains a control character (U+0009)"),
        (
            "invoice\u202efdp.exe",  # shows as "invoiceexe.pdf"
            "file name 'invoice\\u202efdp.exe' contains a control character "
            "(U+202E RIGHT-TO-LEFT OVERRIDE)",
        ),
        (
            "zero\u200bwidth.pdf",
            "file name 'zero\\u200bwidth.pdf' contains a control character "
            "(U+200B ZERO WIDTH SPACE)",
        ),
        (
            "two\u2028lines.pdf",
            "file name 'two\\u2028lines.pdf' contains a line break (U+2028 LINE SEPARATOR)",
        ),
        (
            "bad\udcff.pdf",  # an undecodable byte, as os.fsdecode escapes it
            "file name 'bad\\udcff.pdf' contains a lone surrogate (not valid Unicode) (U+DCFF)",
        ),
        ("a/b/c.pdf", "file name 'a/b/c.pdf' may not contain '/': choose the folder instead"),
        ("/etc/passwd.txt", "file name '/etc/passwd.txt' may not contain '/': choose the folder"),
        ("C:\\fakepath\\report.pdf", "file name 'C:\\\\fakepath\\\\report.pdf' may not contain a"),
        ("C:report.pdf", "file name 'C:report.pdf' may not start with a drive ('C:')"),
        (".", "file name '.' may not be '.' or '..'"),
        ("..", "file name '..' may not be '.' or '..'"),
        (".env.txt", "file name '.env.txt' starts with '.': ingestion passes hidden files over"),
        (".pdf", "file name '.pdf' starts with '.'"),
        ("setup.exe", "file name 'setup.exe': unsupported file type '.exe' (ingestion reads .pdf,"),
        ("README", "file name 'README': unsupported file type '(no extension)'"),
        ("photos.zip", "file name 'photos.zip': unsupported file type '.zip'"),
        ("report.pdf.", "file name 'report.pdf.': unsupported file type '(no extension)'"),
        ("minutes.doc", "file name 'minutes.doc': legacy binary Word file; save it as .docx"),
        ("deck.PPT", "file name 'deck.PPT': legacy binary PowerPoint file; save it as .pptx"),
        ("budget.xls", "file name 'budget.xls': legacy binary Excel file; save it as .xlsx"),
    ],
)
def test_refused_file_names_say_why(filename: str, reason: str) -> None:
    assert name_refusal("hr", filename).startswith(reason)


@pytest.mark.parametrize(
    ("folder", "reason"),
    [
        ("hr\x00", "folder 'hr\\x00' contains a control character (U+0000)"),
        ("hr\n/x", "folder 'hr\\n/x' contains a control character (U+000A)"),
        ("hr\r", "folder 'hr\\r' contains a control character (U+000D)"),
        ("hr\tx", "folder 'hr\\tx' contains a control character (U+0009)"),
        ("hr/\u202egpj", "folder 'hr/\\u202egpj' contains a control character (U+202E RIGHT"),
        ("hr\\policies", "folder 'hr\\\\policies' may not contain a backslash"),
        ("/etc", "folder '/etc' is absolute (starts with '/')"),
        ("/", "folder '/' is absolute"),
        ("C:", "folder 'C:' may not start with a drive ('C:')"),
        ("c:/Users", "folder 'c:/Users' may not start with a drive ('c:')"),
        ("hr//policies", "folder 'hr//policies' has an empty part ('//')"),
        (" ", "folder ' ' has a blank part (' ')"),
        ("hr/ /x", "folder 'hr/ /x' has a blank part (' ')"),
        (".", "folder '.' may not have a '.' part"),
        ("hr/../../etc", "folder 'hr/../../etc' may not have a '..' part"),
        ("hr/./x", "folder 'hr/./x' may not have a '.' part"),
        (
            "hr/.git",
            "folder 'hr/.git' has a part starting with '.' ('.git'): ingestion passes hidden "
            "folders over",
        ),
    ],
)
def test_refused_folders_say_why(folder: str, reason: str) -> None:
    assert name_refusal(folder, "report.pdf").startswith(reason)
    with pytest.raises(UploadNameError) as alone:
        upload_folder(folder)
    assert str(alone.value) == name_refusal(folder, "report.pdf")


def test_a_name_is_checked_as_nfc_composes_it() -> None:
    """U+0958 (3 bytes) is a composition exclusion: NFC writes it as two characters of 3
    bytes each, so a name within the limit as sent is over it as it would be stored."""
    filename = "\u0958" * 83 + ".pdf"
    assert len(filename.encode()) <= MAX_NAME_BYTES
    assert len(unicodedata.normalize("NFC", filename).encode()) > MAX_NAME_BYTES
    assert "is 502 bytes in UTF-8, over the limit of 255" in name_refusal("", filename)


def test_a_refused_value_is_quoted_cut_to_100_characters_on_one_line() -> None:
    filename = "\n".join(["line"] * 200) + ".pdf"
    reason = name_refusal("", filename)
    shown = reason.removeprefix("file name ").split(" contains")[0]
    assert shown == repr(filename[:100]) + "…"
    assert len(reason) < 200


def test_the_legacy_reasons_are_ingestions_own() -> None:
    """What ingestion says of a real legacy file (tests/odd_documents) is the name's reason."""
    for suffix, legacy in {
        ".doc": "poi-empty.doc",
        ".ppt": "poi-empty.ppt",
        ".xls": "tika-testEXCEL_95.xls",
    }.items():
        with pytest.raises(SkipFile) as skipped:
            REFUSED[suffix](ODD / legacy, LoadOptions())
        assert name_refusal("", f"file{suffix}") == f"file name 'file{suffix}': {skipped.value}"


# ----------------------------------------------------------------------------- content
def write_image(path: Path, kind: str) -> Path:
    from PIL import Image, ImageDraw

    image = Image.new("L", (120, 40), 255)
    ImageDraw.Draw(image).text((5, 10), "Scan 42", fill=0)
    image.save(path, kind)
    return path


def _samples() -> list[tuple[Path, str]]:
    return [
        (SAMPLES / "policies" / "travel-policy.pdf", "pdf"),
        (SAMPLES / "scans" / "office-safety-notice.pdf", "pdf"),
        (SAMPLES / "handbook" / "onboarding-guide.docx", "docx"),
        (SAMPLES / "support" / "support-playbook.pptx", "pptx"),
        (SAMPLES / "catalog" / "service-rates.xlsx", "xlsx"),
        (SAMPLES / "catalog" / "products.csv", "csv"),
        (SAMPLES / "catalog" / "accessories.jsonl", "json"),
        (SAMPLES / "handbook" / "employee-handbook.md", "markdown"),
        (SAMPLES / "web" / "about.html", "html"),
        (SAMPLES / "notes" / "it-faq.txt", "text"),
        (FIXTURES / "docs" / "beds.json", "json"),
        (FIXTURES / "docs" / "tools.csv", "csv"),
        (FIXTURES / "strict" / "sample.strict.xlsx", "xlsx"),  # Strict Open XML
        (ODD / "pydocx-300-dpi.TIF", "image"),
        (ODD / "oxsdk-Open_XML_API_testing_Macro_enabled.docm", "docx"),
        (ODD / "oxsdk-macro_enabled.pptm", "pptx"),
        (ODD / "oxsdk-macro.xlsm", "xlsx"),
    ]


@pytest.mark.parametrize(("path", "format_name"), _samples(), ids=lambda v: getattr(v, "name", v))
def test_real_files_of_each_format_are_accepted(path: Path, format_name: str) -> None:
    assert sniff_upload(path, path.name) == format_name


def test_every_format_is_accepted_from_a_file_written_here(tmp_path: Path) -> None:
    written = {
        "a.pdf": write_pdf(tmp_path / "a.pdf", ["Travel is booked through the portal."]),
        "a.docx": write_docx(tmp_path / "a.docx"),
        "a.pptx": write_pptx(tmp_path / "a.pptx"),
        "a.xlsx": write_xlsx(tmp_path / "a.xlsx"),
        "a.png": write_image(tmp_path / "a.png", "PNG"),
        "a.jpg": write_image(tmp_path / "a.jpg", "JPEG"),
        "a.tiff": write_image(tmp_path / "a.tiff", "TIFF"),
        "a.md": staged(tmp_path, b"# Leave\n\nTwenty-five days.\n", "a.md"),
        "a.html": staged(tmp_path, b"<html><body><p>Hi</p></body></html>", "a.html"),
        "a.txt": staged(tmp_path, "Grüße, naïve café\n".encode(), "a.txt"),
        "a.csv": staged(tmp_path, b"sku,count\nA-1,3\n", "a.csv"),
        "a.json": staged(tmp_path, b'[{"sku": "A-1"}]', "a.json"),
    }
    found = {name: sniff_upload(path, name) for name, path in written.items()}
    assert found == {
        "a.pdf": "pdf",
        "a.docx": "docx",
        "a.pptx": "pptx",
        "a.xlsx": "xlsx",
        "a.png": "image",
        "a.jpg": "image",
        "a.tiff": "image",
        "a.md": "markdown",
        "a.html": "html",
        "a.txt": "text",
        "a.csv": "csv",
        "a.json": "json",
    }
    assert set(found.values()) == {f.name for f in FORMATS}


def test_an_image_is_read_by_its_content_whatever_its_image_suffix(tmp_path: Path) -> None:
    jpeg = write_image(tmp_path / "photo.jpg", "JPEG")
    for name in ("photo.png", "photo.tif", "photo.JPEG"):
        assert sniff_upload(jpeg, name) == "image"


def test_a_pdf_may_have_up_to_1024_bytes_before_its_header_as_pdfium_reads_it(
    tmp_path: Path,
) -> None:
    pdf = write_pdf(tmp_path / "plain.pdf", ["Expenses are filed within thirty days."]).read_bytes()
    within = staged(tmp_path, b"\x00junk" * 204 + b"...." + pdf, "within.pdf")
    assert within.read_bytes().index(b"%PDF-") == 1024
    assert sniff_upload(within, "expenses.pdf") == "pdf"
    assert load_file(within).format == "pdf"  # and ingestion reads it
    beyond = staged(tmp_path, b"x" + within.read_bytes(), "beyond.pdf")
    assert content_refusal(beyond, "expenses.pdf") == (
        "'expenses.pdf' is not a PDF (no %PDF- header in its first 1,024 bytes)"
    )
    assert ingest_reason(beyond).startswith("corrupt PDF")  # nor does ingestion


def test_text_with_a_utf8_bom_or_a_character_cut_at_64_kib_is_accepted(tmp_path: Path) -> None:
    bom = staged(tmp_path, codecs.BOM_UTF8 + "Überblick\n".encode())
    assert sniff_upload(bom, "overview.md") == "markdown"
    # "é" is two bytes: the first 64 KiB end between them.
    cut = staged(tmp_path, b"a" * (HEAD_BYTES - 1) + "é and more\n".encode(), "cut.part")
    assert sniff_upload(cut, "long.txt") == "text"
    # Only the first 64 KiB are read: a NUL a megabyte in is ingestion's to find.
    late = staged(tmp_path, b"line\n" * (2**20 // 5) + b"\x00", "late.part")
    assert sniff_upload(late, "log.txt") == "text"


# ----------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("name", ["empty.pdf", "empty.docx", "empty.png", "empty.txt", "e.csv"])
def test_an_empty_file_is_refused(tmp_path: Path, name: str) -> None:
    assert content_refusal(staged(tmp_path, b""), name) == f"{name!r} is empty"


def test_a_text_file_of_white_space_is_refused_as_empty(tmp_path: Path) -> None:
    assert content_refusal(staged(tmp_path, b" \n\t\r\n"), "blank.md") == (
        "'blank.md' is empty (nothing but white space)"
    )


def test_a_name_ingestion_does_not_read_is_refused_with_the_names_reason(tmp_path: Path) -> None:
    with pytest.raises(UploadContentError) as refused:
        sniff_upload(staged(tmp_path, b"MZ\x90\x00"), "setup.exe")
    assert str(refused.value) == name_refusal("", "setup.exe")
    with pytest.raises(UploadContentError) as refused:
        sniff_upload(ODD / "poi-empty.doc", "minutes.doc")
    assert str(refused.value) == (
        "file name 'minutes.doc': legacy binary Word file; save it as .docx to have it read"
    )


def test_a_pdf_that_is_not_one_is_refused_naming_what_it_is(tmp_path: Path) -> None:
    png = write_image(tmp_path / "scan.png", "PNG")
    assert content_refusal(png, "scan.pdf") == (
        "'scan.pdf': this .pdf file is a PNG image; rename it .png"
    )
    docx = write_docx(tmp_path / "a.docx")
    assert content_refusal(docx, "a.pdf") == (
        "'a.pdf': this .pdf file is a Word document; rename it .docx"
    )
    text = staged(tmp_path, b"Just some text, saved with the wrong name.\n")
    assert content_refusal(text, "notes.pdf") == (
        "'notes.pdf' is not a PDF (no %PDF- header in its first 1,024 bytes)"
    )


def test_an_image_that_is_not_one_is_refused_naming_what_it_is(tmp_path: Path) -> None:
    pdf = write_pdf(tmp_path / "a.pdf", ["A page."])
    assert content_refusal(pdf, "scan.png") == (
        "'scan.png': this .png file is a PDF; rename it .pdf"
    )
    gif = staged(tmp_path, b"GIF89a\x01\x00\x01\x00\x00\x00\x00;")
    assert content_refusal(gif, "scan.jpg") == (
        "'scan.jpg' is not a PNG, JPEG or TIFF image (unrecognised header)"
    )


@pytest.mark.parametrize(
    ("write", "name", "reason"),
    [
        (write_xlsx, "sheet.docx", "this .docx file is an Excel workbook; rename it .xlsx"),
        (write_pptx, "deck.docx", "this .docx file is a PowerPoint deck; rename it .pptx"),
        (write_docx, "letter.xlsx", "this .xlsx file is a Word document; rename it .docx"),
        (write_xlsx, "sheet.pptm", "this .pptm file is an Excel workbook; rename it .xlsx"),
    ],
)
def test_an_office_file_of_another_kind_is_refused_naming_its_kind(
    tmp_path: Path, write: Callable[[Path], Path], name: str, reason: str
) -> None:
    path = write(tmp_path / f"real{Path(name).suffix}.zip")
    assert content_refusal(path, name) == f"{name!r}: {reason}"


def test_a_password_protected_office_file_gets_ingestions_reason(tmp_path: Path) -> None:
    for write, suffix in ((write_docx, ".docx"), (write_pptx, ".pptx"), (write_xlsx, ".xlsx")):
        locked = encrypt_office(write(tmp_path / f"plain{suffix}"), tmp_path / f"locked{suffix}")
        reason = ingest_reason(locked)
        assert reason.endswith("file (encrypted); save a copy without a password")
        assert content_refusal(locked, f"report{suffix}") == f"'report{suffix}': {reason}"
    # Encrypted by Office itself (tests/odd_documents).
    office = ODD / "tika-testWORD_protected_passtika.docx"
    assert content_refusal(office, "a.docx") == f"'a.docx': {ingest_reason(office)}"


def test_a_legacy_office_file_under_a_new_suffix_gets_ingestions_reason(tmp_path: Path) -> None:
    renamed = shutil.copy(ODD / "poi-empty.doc", tmp_path / "minutes.docx")
    reason = ingest_reason(Path(renamed))
    assert reason == "legacy binary Word file (not Office Open XML); save it in the current format"
    assert content_refusal(Path(renamed), "minutes.docx") == f"'minutes.docx': {reason}"


def test_a_zip_bomb_is_refused_as_ingestion_refuses_it(tmp_path: Path) -> None:
    bomb = write_zip_bomb(tmp_path / "bomb.docx")
    assert sum(i.file_size for i in zipfile.ZipFile(bomb).infolist()) > MAX_UNZIPPED_BYTES
    reason = ingest_reason(bomb)
    assert reason == "Word file would unzip to 601 MB, over the cap of 512 MB (a zip bomb?)"
    assert content_refusal(bomb, "bomb.docx") == f"'bomb.docx': {reason}"


def test_a_zip_of_too_many_parts_is_refused_as_ingestion_refuses_it(tmp_path: Path) -> None:
    parts = write_many_parts(tmp_path / "parts.docx")
    assert len(zipfile.ZipFile(parts).infolist()) > MAX_PARTS
    reason = ingest_reason(parts)
    assert reason == "Word file has 6,017 parts, over the cap of 5,000"
    assert content_refusal(parts, "parts.docx") == f"'parts.docx': {reason}"


# Traditional PKWARE encryption (ZipCrypto, APPNOTE 6.1), which zipfile decrypts but cannot
# write: an archive as `zip -e` writes it.
def _zipcrypto(data: bytes, password: bytes, crc: int) -> bytes:
    mask = 0xFFFFFFFF

    def crc_step(value: int, byte: int) -> int:
        return ~zlib.crc32(bytes([byte]), ~value & mask) & mask

    keys = [0x12345678, 0x23456789, 0x34567890]

    def update(byte: int) -> None:
        keys[0] = crc_step(keys[0], byte)
        keys[1] = ((keys[1] + (keys[0] & 0xFF)) * 134775813 + 1) & mask
        keys[2] = crc_step(keys[2], keys[1] >> 24)

    for byte in password:
        update(byte)
    out = bytearray()
    for byte in os.urandom(11) + bytes([crc >> 24]) + data:
        key = (keys[2] | 2) & 0xFFFF
        out.append(byte ^ (((key * (key ^ 1)) >> 8) & 0xFF))
        update(byte)
    return bytes(out)


def write_encrypted_zip(
    path: Path, parts: dict[str, bytes], encrypted: str, password: bytes
) -> Path:
    """A zip of ``parts`` (stored) whose part ``encrypted`` is encrypted with ``password``."""
    body, directory = bytearray(), bytearray()
    for name, data in parts.items():
        crc, flags = zlib.crc32(data), 1 if name == encrypted else 0
        stored = _zipcrypto(data, password, crc) if flags else data
        raw = name.encode()
        offset = len(body)
        # The local header, then the directory's entry: version 2.0, the flags, stored,
        # 1980-01-01 00:00, the CRC, both sizes, the name's length (APPNOTE 4.3.7, 4.3.12).
        body += struct.pack(
            "<4s5H3L2H", b"PK\x03\x04", 20, flags, 0, 0, 0x21, crc, len(stored), len(data),
            len(raw), 0,
        )  # fmt: skip
        body += raw + stored
        directory += struct.pack(
            "<4s6H3L5H2L", b"PK\x01\x02", 20, 20, flags, 0, 0, 0x21, crc, len(stored),
            len(data), len(raw), 0, 0, 0, 0, 0, offset,
        )  # fmt: skip
        directory += raw
    end = struct.pack(
        "<4s4H2LH", b"PK\x05\x06", 0, 0, len(parts), len(parts), len(directory), len(body), 0
    )
    path.write_bytes(bytes(body + directory + end))
    return path


def test_a_zip_with_an_encrypted_part_is_refused_as_encrypted(tmp_path: Path) -> None:
    with zipfile.ZipFile(write_docx(tmp_path / "plain.docx")) as plain:
        parts = {info.filename: plain.read(info) for info in plain.infolist()}
    locked = write_encrypted_zip(tmp_path / "locked.docx", parts, "word/document.xml", b"pw")
    with zipfile.ZipFile(locked) as archive:  # a real encrypted part: it opens with its password
        assert archive.read("word/document.xml", pwd=b"pw") == parts["word/document.xml"]
        assert archive.read("[Content_Types].xml") == parts["[Content_Types].xml"]
    assert content_refusal(locked, "letter.docx") == (
        "'letter.docx': its part 'word/document.xml' is encrypted (a zip password); save a copy "
        "without a password"
    )
    assert ingest_reason(locked).startswith("corrupt Word file")


def test_an_office_name_on_something_else_is_refused_with_what_it_is(tmp_path: Path) -> None:
    plain_zip = tmp_path / "photos.zip"
    with zipfile.ZipFile(plain_zip, "w") as archive:
        archive.writestr("notes.txt", "not an office file")
    assert content_refusal(plain_zip, "report.docx") == (
        "'report.docx' is not a Word document: a zip archive, but no Office Open XML package "
        "(it has no [Content_Types].xml)"
    )
    odd_package = tmp_path / "odd.zip"
    with zipfile.ZipFile(odd_package, "w") as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        archive.writestr("visio/document.xml", "<x/>")
    assert content_refusal(odd_package, "deck.pptx") == (
        "'deck.pptx' is not a PowerPoint deck: its package has no ppt/ part"
    )
    cut = staged(tmp_path, write_xlsx(tmp_path / "x.xlsx").read_bytes()[:2000], "cut.xlsx")
    assert content_refusal(cut, "prices.xlsx") == (
        "'prices.xlsx': corrupt Excel file (not a readable zip archive: File is not a zip file)"
    )
    assert ingest_reason(cut).startswith("corrupt Excel file (not a readable zip archive")
    text = staged(tmp_path, b"Dear team, the notes follow.\n")
    assert content_refusal(text, "notes.docx") == (
        "'notes.docx' is not a Word document (not a zip archive)"
    )
    pdf = write_pdf(tmp_path / "a.pdf", ["A page."])
    assert content_refusal(pdf, "notes.docx") == (
        "'notes.docx': this .docx file is a PDF; rename it .pdf"
    )


@pytest.mark.parametrize(
    ("encoding", "reason"),
    [
        ("utf-16-le", "is UTF-16; save it as UTF-8"),
        ("utf-16-be", "is UTF-16; save it as UTF-8"),
        ("utf-32-le", "is UTF-32; save it as UTF-8"),
        ("utf-32-be", "is UTF-32; save it as UTF-8"),
    ],
)
def test_utf16_and_utf32_text_is_refused(tmp_path: Path, encoding: str, reason: str) -> None:
    bom = {
        "utf-16-le": codecs.BOM_UTF16_LE,
        "utf-16-be": codecs.BOM_UTF16_BE,
        "utf-32-le": codecs.BOM_UTF32_LE,
        "utf-32-be": codecs.BOM_UTF32_BE,
    }[encoding]
    path = staged(tmp_path, bom + "sku,count\nA-1,3\n".encode(encoding))
    assert content_refusal(path, "stock.csv") == f"'stock.csv' {reason}"


def test_a_utf16_web_page_from_the_odd_documents_is_refused(tmp_path: Path) -> None:
    page = ODD / "tika-testHTML_charset_utf16le.html"
    assert content_refusal(page, "page.html") == "'page.html' is UTF-16; save it as UTF-8"


def test_text_that_is_not_utf8_or_has_nul_bytes_is_refused(tmp_path: Path) -> None:
    russian = ODD / "tika-russian.cp866.txt"  # a DOS code page
    assert content_refusal(russian, "notes.txt") == (
        "'notes.txt' is not valid UTF-8 text (byte 0: invalid start byte); save it as UTF-8"
    )
    latin1 = staged(tmp_path, codecs.BOM_UTF8 + "Prix: 12 €\nCafé\n".encode("cp1252"))
    assert content_refusal(latin1, "prices.md") == (
        "'prices.md' is not valid UTF-8 text (byte 12: invalid start byte); save it as UTF-8"
    )
    nul = staged(tmp_path, b"sku,count\nA-1\x00,3\n")
    assert content_refusal(nul, "stock.csv") == (
        "'stock.csv' is not text: it has a NUL byte (byte 13)"
    )


@pytest.mark.parametrize(
    ("make", "name", "reason"),
    [
        (
            lambda d: write_pdf(d / "a.pdf", ["A page."]),
            "notes.txt",
            "this .txt file is a PDF; rename it .pdf",
        ),
        (
            lambda d: write_image(d / "a.png", "PNG"),
            "stock.csv",
            "this .csv file is a PNG image; rename it .png",
        ),
        (
            lambda d: write_image(d / "a.jpg", "JPEG"),
            "page.html",
            "this .html file is a JPEG image; rename it .jpg",
        ),
        (
            lambda d: write_docx(d / "a.docx"),
            "guide.md",
            "this .md file is a Word document; rename it .docx",
        ),
        (
            lambda d: write_xlsx(d / "a.xlsx"),
            "rows.json",
            "this .json file is an Excel workbook; rename it .xlsx",
        ),
        (
            lambda d: Path(shutil.copy(ODD / "poi-empty.doc", d / "a.doc")),
            "notes.txt",
            "this .txt file is a legacy binary Office file (not Office Open XML); save it in "
            "the current format",
        ),
        (
            lambda d: Path(shutil.copy(ODD / "tika-testWORD_protected_passtika.docx", d / "a")),
            "notes.txt",
            "this .txt file is a password-protected Office file (encrypted); save a copy "
            "without a password",
        ),
    ],
)
def test_text_that_is_really_something_else_is_refused_naming_it(
    tmp_path: Path, make: Callable[[Path], Path], name: str, reason: str
) -> None:
    assert content_refusal(make(tmp_path), name) == f"{name!r}: {reason}"


def test_a_zip_or_a_program_under_a_text_name_is_refused_naming_it(tmp_path: Path) -> None:
    plain_zip = tmp_path / "photos.zip"
    with zipfile.ZipFile(plain_zip, "w") as archive:
        archive.writestr("notes.txt", "inside a zip")
    assert content_refusal(plain_zip, "notes.txt") == "'notes.txt': this .txt file is a zip archive"
    program = Path(sys.executable).resolve()
    if program.read_bytes()[:4] != b"\x7fELF":
        pytest.skip("this Python is not an ELF program")
    assert content_refusal(program, "data.jsonl") == (
        "'data.jsonl': this .jsonl file is a program (an ELF executable)"
    )


def test_reasons_name_the_upload_not_the_staged_file(tmp_path: Path) -> None:
    path = staged(tmp_path, b"", "job-7f3a/0-upload.part")
    reason = content_refusal(path, "Quarterly report.pdf")
    assert reason == "'Quarterly report.pdf' is empty"
    assert "job-7f3a" not in reason and "upload.part" not in reason
    long_name = "r" * 300 + ".txt"
    reason = content_refusal(staged(tmp_path, b"\x00\x01"), long_name)
    assert reason.startswith(f"{'r' * 100!r}… is not text")


# ----------------------------------------------------------------------------- in a worker
def test_the_check_runs_in_a_budgeted_worker_and_its_refusal_crosses_back(tmp_path: Path) -> None:
    """As the server runs it: in a worker process under the parse budget; the arguments,
    the result and the refusal all pickle."""
    error = UploadContentError("'a.pdf' is empty")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is UploadContentError and str(copy) == str(error)
    assert isinstance(copy, ValueError)
    assert str(pickle.loads(pickle.dumps(UploadNameError("x")))) == "x"
    calls = BudgetedCalls(ParseBudget(memory_mb=512, seconds=60))
    try:
        docx = SAMPLES / "handbook" / "onboarding-guide.docx"
        assert calls.call(sniff_upload, docx, "guide.docx") == "docx"
        with pytest.raises(UploadContentError) as refused:
            calls.call(sniff_upload, docx, "sheet.xlsx")
        assert str(refused.value) == (
            "'sheet.xlsx': this .xlsx file is a Word document; rename it .docx"
        )
    finally:
        calls.close()
