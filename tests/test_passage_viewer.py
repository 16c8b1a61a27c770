"""The passage viewer: a citation on the chat page opens its document at the place, the cited
words highlighted, in a real browser (Debian's Chromium) at five viewport sizes.

The index is built by `ragchains ingest` and served by `ragchains serve` as subprocesses, as a
user runs them, with a keys file: the reader's key reads everything but the security policy,
which only the ``it`` group may read. Every page fails its test on a console error, an
uncaught page error, a dialog, or a request to another origin.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pypdfium2 as pdfium
import pytest
from PIL import Image

from ragchains.serving.keys import add_key
from tests.browser import WatchedPage, open_page
from tests.servers import REPO, ragchains_serve
from tests.test_chat_page import LAYOUT_SIZES, viewport_id
from tests.test_cli import run
from tests.test_ocr import DPI, draw_page

pytestmark = [pytest.mark.slow, pytest.mark.browser]

MODEL_WAIT = 180_000  # ms: the embedded model on a busy machine
HIDDEN = "samples/policies/security-policy.pdf"
HOSTILE_MD = """# Visitor rules

Visitors sign in at reception and wear a badge at all times.

<script>window.pwned = "markdown script"; alert("md")</script>
<img src="x" onerror="window.pwned='img'; alert('img')">
<svg onload="window.pwned='svg'; alert('svg')"><circle r="5"/></svg>
<a href="javascript:alert('link')">a link</a>

Badges are returned at reception when the visitor leaves.
"""
SCAN_LINES = [
    "Forklift licences",
    "Forklift drivers renew their forklift licence every three years at the depot.",
]
HOSTILE_HTML = """<!doctype html><html><head><title>Parking rules</title>
<script>document.title = "pwned"; localStorage.setItem("pwned", "1"); alert("html")</script>
</head><body><main><h1>Parking rules</h1>
<p>Staff park on levels two and three of the garage; level one is kept for visitors.</p>
<svg onload="alert('svg in html')"><circle r="5"/></svg>
<p>Electric cars charge at the six bays next to the garage entrance.</p>
</main></body></html>
"""


# ----------------------------------------------------------------------------- the server
@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("viewer-keys")
    path = folder / "keys.toml"
    return {
        "path": str(path),
        "reader": add_key(path, "reader", ["staff"]),
        "it": add_key(path, "ivan", ["it", "staff"]),
    }


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The samples and two hostile files, ingested by `ragchains ingest`."""
    root = tmp_path_factory.mktemp("viewer")
    hostile = root / "hostile"
    hostile.mkdir()
    (hostile / "visitor-rules.md").write_text(HOSTILE_MD)
    (hostile / "parking.html").write_text(HOSTILE_HTML)
    scans = root / "scans"
    scans.mkdir()
    page, _ = draw_page(SCAN_LINES, size_pt=14)
    page.save(scans / "forklift-notice.png", dpi=(300, 300))
    target = root / "index"
    done = run("ingest", "samples", hostile, scans, "--index", target, "--access", f"{HIDDEN}=it")
    assert done.returncode == 0, done.stderr
    return target


@pytest.fixture(scope="module")
def base(index: Path, keys: dict[str, str]) -> Iterator[str]:
    with ragchains_serve("--index", str(index), RAGCHAINS_KEYS_FILE=keys["path"]) as url:
        yield url


@pytest.fixture(params=LAYOUT_SIZES, ids=viewport_id)
def size(request: pytest.FixtureRequest) -> tuple[int, int]:
    return tuple(request.param)  # type: ignore[return-value]


# ----------------------------------------------------------------------------- the page
class Viewer:
    """The chat page with a key, watched for errors, dialogs and requests elsewhere."""

    def __init__(self, watched: WatchedPage, base: str) -> None:
        self.watched = watched
        self.page = watched.page
        self.base = base
        self.dialogs: list[str] = []
        self.elsewhere: list[str] = []
        self.page.on(
            "dialog", lambda dialog: (self.dialogs.append(dialog.message), dialog.dismiss())
        )
        self.page.on(
            "request",
            lambda request: (
                None
                if request.url.startswith((base, "blob:", "data:"))
                else self.elsewhere.append(request.url)
            ),
        )

    def check(self) -> None:
        self.watched.assert_clean()
        assert not self.dialogs, self.dialogs
        assert not self.elsewhere, self.elsewhere
        assert self.page.evaluate("() => window.pwned") is None

    def ask(self, question: str, *, domain: str = "default") -> Any:
        page = self.page
        if self.panel().is_visible():
            page.keyboard.press("Escape")
        menu = page.get_by_role("button", name="Settings")
        if menu.is_visible():
            menu.click()
        page.get_by_role("radio", name="Ask", exact=True).check()
        page.get_by_label("Domain").select_option(domain)
        if menu.is_visible() and menu.get_attribute("aria-expanded") == "true":
            menu.click()
        page.get_by_placeholder("Ask a question about your documents").fill(question)
        page.get_by_role("button", name="Send", exact=True).click()
        page.get_by_role("button", name="Send", exact=True).wait_for(timeout=MODEL_WAIT)
        turn = page.locator(".turn").last
        assert turn.get_by_role("alert").count() == 0, turn.inner_text()
        return turn

    def open_label(self, turn: Any, label: str) -> Any:
        """Opens the source ``label``: its citation in the answer, else its entry in the
        sources; returns the panel once the viewer has drawn."""
        link = turn.locator(".answer-text a.cite", has_text=label)
        if link.count() == 0:
            link = turn.locator(".sources a.cite", has_text=label)
        link.first.click()
        panel = self.panel()
        panel.wait_for()
        panel.locator(".source-view > :not(.viewer-note)").first.wait_for(timeout=60_000)
        return panel

    def panel(self) -> Any:
        return self.page.get_by_role("complementary", name="Source")

    def in_view(self, selector: str) -> bool:
        """Whether the first ``selector`` in the panel lies within the panel's visible part."""
        return bool(
            self.page.evaluate(
                """(selector) => {
                  const panel = document.getElementById("source-panel");
                  const node = panel.querySelector(selector);
                  if (!node) return false;
                  const p = panel.getBoundingClientRect(), r = node.getBoundingClientRect();
                  return r.bottom > p.top && r.top < p.bottom && r.height > 0;
                }""",
                selector,
            )
        )


@pytest.fixture
def viewer(browser: Any, base: str, keys: dict[str, str]) -> Iterator[Callable[..., Viewer]]:
    opened: list[Viewer] = []

    def open_viewer(size: tuple[int, int], key: str = "reader") -> Viewer:
        context = browser.new_context(viewport={"width": size[0], "height": size[1]})
        context.add_init_script(f"localStorage.setItem('ragchains.api-key', '{keys[key]}')")
        watched = open_page(context, base, width=size[0], height=size[1])
        watched.page.locator("#domain option[value='hr']").wait_for(state="attached")
        opened.append(Viewer(watched, base))
        return opened[-1]

    yield open_viewer
    try:
        for shown in opened:
            shown.check()
    finally:
        for shown in opened:
            shown.page.context.close()


# ----------------------------------------------------------------------------- PDF pages
def sentence_lines(pdf: Path, page_number: int, sentence: str) -> list[tuple[float, ...]]:
    """The boxes of ``sentence`` on the page, one per line, in PDF points from the top-left
    corner, as pdfium records them."""
    document = pdfium.PdfDocument(pdf)
    try:
        page = document[page_number - 1]
        height = page.get_height()
        text = page.get_textpage()
        chars = [(i, text.get_text_range(i, 1)) for i in range(text.count_chars())]
        kept = [(i, c) for i, c in chars if c.strip()]
        flat = "".join(c for _, c in kept)
        wanted = re.sub(r"\s+", "", sentence)
        at = flat.find(wanted)
        assert at >= 0, f"{sentence!r} is not on page {page_number}"
        lines: list[list[float]] = []
        for i, _ in kept[at : at + len(wanted)]:
            left, bottom, right, top = text.get_charbox(i)
            box = [left, height - top, right, height - bottom]
            if lines and abs(lines[-1][1] - box[1]) < 4:
                line = lines[-1]
                lines[-1] = [
                    min(line[0], box[0]),
                    min(line[1], box[1]),
                    max(line[2], box[2]),
                    max(line[3], box[3]),
                ]
            else:
                lines.append(box)
        return [tuple(line) for line in lines]
    finally:
        document.close()


def drawn_boxes(page: Any, selector: str) -> list[tuple[float, ...]]:
    """Where the highlights ``selector`` are drawn over the page, in PDF points."""
    boxes = page.evaluate(
        """(selector) => {
          const frame = document.querySelector("#source-view .page-frame");
          const canvas = frame.querySelector("canvas, img");
          const c = canvas.getBoundingClientRect();
          const width = Number(frame.dataset.pageWidth);
          const scale = c.width / width;
          return [...frame.querySelectorAll(selector)].map((node) => {
            const r = node.getBoundingClientRect();
            return [(r.left - c.left) / scale, (r.top - c.top) / scale,
                    (r.right - c.left) / scale, (r.bottom - c.top) / scale];
          });
        }""",
        selector,
    )
    return [tuple(box) for box in boxes]


def overlaps(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_a_pdf_citation_opens_its_page_with_the_quoted_sentence_highlighted(
    viewer: Callable[..., Viewer], size: tuple[int, int], tmp_path: Path
) -> None:
    shown = viewer(size)
    turn = shown.ask("What is the per diem for meals while travelling?")
    answer = turn.locator(".answer-text")
    assert "travel-policy.pdf#page=2" in answer.inner_text()
    panel = shown.open_label(turn, "travel-policy.pdf#page=2")
    assert panel.get_by_role("group", name="Pages").inner_text().count("Page 2 of 3") == 1
    frame = panel.locator(".page-frame")
    frame.wait_for()
    # The page is drawn: a picture with ink on it, not an empty canvas.
    shot = tmp_path / "page.png"
    frame.screenshot(path=str(shot))
    with Image.open(shot) as image:
        darkest = image.convert("L").getextrema()[0]
    assert darkest < 100

    quoted = answer.inner_text().split("[travel-policy.pdf#page=2]")[0].strip()
    sentence = quoted.splitlines()[-1].strip()
    lines = sentence_lines(REPO / "samples/policies/travel-policy.pdf", 2, sentence)
    chunk = drawn_boxes(shown.page, ".hl:not(.hl-quote)")
    strong = drawn_boxes(shown.page, ".hl-quote")
    assert chunk and strong
    for line in lines:
        assert any(overlaps(line, box) for box in chunk), (line, chunk)
        assert any(overlaps(line, box) for box in strong), (line, strong)
    # The panel opened scrolled to the highlight; the pages turn.
    assert shown.in_view(".hl-quote")
    panel.get_by_role("button", name="Next page").click()
    panel.get_by_text("Page 3 of 3").wait_for()
    assert panel.locator(".hl").count() == 0
    panel.get_by_role("button", name="Previous page").click()
    panel.get_by_text("Page 2 of 3").wait_for()
    panel.locator(".hl-quote").first.wait_for()


def test_a_scanned_image_citation_shows_the_page_with_the_ocr_boxes_over_its_words(
    viewer: Callable[..., Viewer],
) -> None:
    shown = viewer((768, 1024))
    turn = shown.ask("How often do forklift drivers renew their forklift licence?")
    panel = shown.open_label(turn, "forklift-notice.png")
    panel.locator(".page-frame img").wait_for()
    assert panel.get_by_role("group", name="Pages").inner_text().count("Page 1 of 1") == 1
    # Where the words were printed, in PDF points (the image is 300 dpi).
    _, printed = draw_page(SCAN_LINES, size_pt=14)
    drawn = drawn_boxes(shown.page, ".hl")
    assert drawn
    for word in ("drivers", "renew", "depot."):
        box = tuple(v * 72 / DPI for v in printed[word])
        assert any(overlaps(box, hl) for hl in drawn), (word, box, drawn)
    assert shown.in_view(".hl")


# ----------------------------------------------------------------------------- documents
def test_a_markdown_citation_shows_the_rendered_section_with_the_chunk_in_view(
    viewer: Callable[..., Viewer], size: tuple[int, int]
) -> None:
    shown = viewer(size)
    turn = shown.ask("How many weeks of paid parental leave do birth parents receive?", domain="hr")
    panel = shown.open_label(turn, "employee-handbook.md#parental-leave")
    document = panel.locator(".document")
    assert document.get_by_role("heading", name="Brightwater Labs Employee Handbook").count() == 1
    assert document.get_by_role("heading", name="Parental leave").count() == 1
    assert "##" not in document.inner_text()
    hit = document.locator(".hit")
    assert "20 weeks" in " ".join(hit.all_inner_texts())
    assert shown.in_view(".hit")


def test_a_quote_under_its_heading_is_the_sentence_the_viewer_marks(
    viewer: Callable[..., Viewer], size: tuple[int, int]
) -> None:
    shown = viewer(size)
    turn = shown.ask("How many unused PTO days carry over into the next year?")
    answer = turn.locator(".answer-text")
    # The sentence names nothing of its section: the answer shows the heading, in bold.
    assert answer.locator("strong").first.inner_text() == "Paid time off:"
    assert "Up to 5 unused days carry over" in answer.inner_text()
    panel = shown.open_label(turn, "employee-handbook.md#paid-time-off")
    quoted = panel.locator(".document .quote")
    quoted.first.wait_for()
    assert "Up to 5 unused days carry over" in " ".join(quoted.all_inner_texts())


def test_a_catalog_row_shows_its_header_and_neighbours(
    viewer: Callable[..., Viewer], size: tuple[int, int]
) -> None:
    shown = viewer(size)
    turn = shown.ask("How much does the FlowMeter Mini cost?", domain="catalog")
    panel = shown.open_label(turn, "products.csv#row=3")
    table = panel.locator(".table-view table")
    header = table.locator("thead").inner_text()
    assert "name" in header and "price" in header
    row = table.locator("tr.hit")
    assert row.count() == 1 and "FlowMeter Mini" in row.inner_text()
    assert table.locator("tbody tr").count() >= 5  # the rows around it
    assert shown.in_view("tr.hit")


def test_a_spreadsheet_row_shows_its_sheet_header_and_row(
    viewer: Callable[..., Viewer], size: tuple[int, int]
) -> None:
    shown = viewer(size)
    turn = shown.ask("How much does a Field Gateway installation cost in the EU?", domain="catalog")
    panel = shown.open_label(turn, "service-rates.xlsx#sheet=EU&row=4")
    table = panel.locator(".table-view table")
    assert "Sheet EU" in table.locator("caption").inner_text()
    row = table.locator("tr.hit")
    assert row.count() == 1 and "Field Gateway" in row.inner_text()
    assert table.locator("thead th").count() >= 3


def test_the_standard_plan_shows_the_plan_table_header_in_the_answer_and_the_viewer(
    viewer: Callable[..., Viewer], size: tuple[int, int]
) -> None:
    shown = viewer(size)
    turn = shown.ask("What does the standard plan cost?")
    answer = turn.locator(".answer-text")
    table = answer.locator("table")
    assert table.count() == 1, answer.inner_html()
    assert "Plan" in table.locator("thead").inner_text()
    assert "Standard" in table.locator("tbody").inner_text()
    panel = shown.open_label(turn, "employee-handbook.md#benefit-plans")
    viewed = panel.locator(".document table")
    assert "Monthly cost" in viewed.locator("thead").inner_text()
    quoted = viewed.locator("tr.quote")
    assert quoted.count() >= 1 and "Standard" in " ".join(quoted.all_inner_texts())


# ----------------------------------------------------------------------------- keyboard
def test_the_keyboard_reaches_and_closes_the_viewer(
    viewer: Callable[..., Viewer], size: tuple[int, int]
) -> None:
    shown = viewer(size)
    page = shown.page
    shown.ask("What is the per diem for meals while travelling?")
    page.get_by_placeholder("Ask a question about your documents").focus()
    for _ in range(60):  # backwards from the question box to the answer's citation
        page.keyboard.press("Shift+Tab")
        if page.evaluate("() => document.activeElement.matches('.answer-text a.cite')"):
            break
    else:
        pytest.fail("Tab never reached a citation")
    label = page.evaluate("() => document.activeElement.textContent")
    page.keyboard.press("Enter")
    panel = shown.panel()
    panel.wait_for()
    assert (
        page.evaluate("() => document.activeElement.getAttribute('aria-label')") == "Close source"
    )
    panel.locator(".page-frame").wait_for(timeout=60_000)
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.closest('#source-panel') !== null")
    page.keyboard.press("Escape")
    assert not panel.is_visible()
    assert page.evaluate("() => document.activeElement.textContent") == label


# ----------------------------------------------------------------------------- access
def test_a_hidden_file_is_404_and_never_named(
    viewer: Callable[..., Viewer], base: str, keys: dict[str, str]
) -> None:
    hidden_id = file_id(base, keys["it"], "How long must passwords be?")
    reader = {"X-API-Key": keys["reader"]}
    response = httpx.get(f"{base}/files/{hidden_id}", headers=reader)
    assert response.status_code == 404
    unknown = httpx.get(f"{base}/files/{'0' * 64}", headers=reader)
    assert response.json() == unknown.json()
    allowed = httpx.get(f"{base}/files/{hidden_id}", headers={"X-API-Key": keys["it"]})
    assert allowed.status_code == 200
    assert allowed.content == (REPO / HIDDEN).read_bytes()

    shown = viewer((1024, 768))
    turn = shown.ask("How long must passwords be?")
    for link in turn.locator("a.cite").all():
        link.click()
        shown.panel().locator(".source-view > :not(.viewer-note)").first.wait_for(timeout=60_000)
    shown.page.get_by_role("button", name="New chat").click()
    shown.page.locator(".holdings").wait_for()
    assert "security-policy" not in shown.page.content()


def file_id(base: str, key: str, query: str) -> str:
    """The file id of the first source /retrieve finds for ``query`` with ``key``."""
    response = httpx.post(
        f"{base}/retrieve/invoke",
        json={"input": {"query": query}, "config": {"configurable": {"threshold": 0.0}}},
        headers={"X-API-Key": key},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    chunks = [doc["metadata"] for doc in response.json()["output"]]
    found = [c["file_id"] for c in chunks if c["source"].endswith("security-policy.pdf")]
    assert found, chunks
    return str(found[0])


def test_hostile_markdown_and_html_are_shown_as_text_and_nothing_runs(
    viewer: Callable[..., Viewer], base: str, keys: dict[str, str]
) -> None:
    shown = viewer((1024, 768))
    for question, label in (
        ("When do visitors return their badges?", "visitor-rules.md"),
        ("Where do staff park in the garage?", "parking.html"),
    ):
        turn = shown.ask(question)
        panel = shown.open_label(turn, label)
        text = panel.locator(".source-view").inner_text()
        assert "Visitors" in text or "Staff park" in text
        assert panel.locator(".source-view script, .source-view svg, .source-view img").count() == 0
    assert shown.page.title() == "ragchains"
    assert shown.page.evaluate("() => localStorage.getItem('pwned')") is None
