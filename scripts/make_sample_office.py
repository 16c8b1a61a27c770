"""Regenerate the sample Word, PowerPoint and Excel files and the scanned PDF from the text
below (needs python-docx, python-pptx and Pillow, which ragchains installs, and the dev
extra's XlsxWriter).

- samples/handbook/onboarding-guide.docx: headings, a bulleted list, a table and one review
  comment (read only with `ragchains ingest --word-notes`);
- samples/support/support-playbook.pptx: five slides with titles, bullets, a table and
  speaker notes;
- samples/catalog/service-rates.xlsx: an EU and a US sheet of typed columns under a merged
  header cell, with formulas whose values are saved in the file;
- samples/scans/office-safety-notice.pdf: two pages of images only, as a scanner makes them
  (slightly rotated, with specks), which ingest reads by OCR.

The files are committed so the quickstart needs nothing beyond the runtime dependencies; run
`python scripts/make_sample_office.py` after editing the text here. Dates, seeds and the zip
archives' timestamps are fixed, so a re-run writes the same bytes.
"""

from __future__ import annotations

import datetime as dt
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
AUTHOR = "Brightwater Labs"
# Recorded in the files' properties in place of the time they were generated.
WRITTEN = dt.datetime(2026, 2, 2, 9, 0, 0)

# ----------------------------------------------------------------------------- Word
GUIDE_TITLE = "Brightwater Labs Onboarding Guide"
GUIDE_INTRO = (
    "This guide walks new employees through their first three months at Brightwater Labs. "
    "People Operations (PeopleOps) keeps it up to date; ask your manager or your onboarding "
    "buddy about anything it does not answer."
)
# (level, heading) or the paragraphs and bullets under it, in order.
GUIDE: list[tuple[str, Any]] = [
    ("h1", "Before your first day"),
    (
        "p",
        "Your manager sends a welcome email two weeks before your start date with the schedule "
        "of your first week.",
    ),
    (
        "p",
        "IT ships your laptop to your home address five business days before you start. "
        "Lisbon employees collect their laptop at the office reception on their first morning "
        "instead.",
    ),
    (
        "p",
        "Bring a photo ID on your first day: reception issues your building badge against it.",
    ),
    ("h1", "Your first week"),
    ("h2", "Day one"),
    (
        "p",
        "Day one starts at 9:30 with a welcome session run by PeopleOps, in the Cascade room "
        "in Portland or the Tejo room in Lisbon. Remote starters join the session by video. "
        "Lunch on day one is with your team and paid by the company.",
    ),
    ("h2", "Your onboarding buddy"),
    (
        "p",
        "Every new employee is paired with an onboarding buddy from another team for their "
        "first 60 days. Your buddy answers everyday questions and meets you for 30 minutes "
        "every week. Buddies volunteer for the role and receive one extra day of PTO for each "
        "new employee they accompany.",
    ),
    ("h1", "Accounts and tools"),
    ("p", "Your accounts are ready on your first morning:"),
    ("li", "Email and calendar: the first password arrives by text message at 8:00."),
    ("li", "Team chat: join the #welcome channel and your team's channel."),
    (
        "li",
        "PeopleHub, the HR system: check your personal details and bank account by the end of "
        "your first week, or your first salary may be late.",
    ),
    ("li", "Expense tool and travel portal: access comes with your account."),
    (
        "li",
        "Code repository and cloud console: engineers request access from their manager.",
    ),
    (
        "p",
        "Complete the Security Basics course (45 minutes) in the learning portal within your "
        "first 14 days. Access to the code repository and the cloud console is paused until "
        "the course is done.",
    ),
    ("h1", "Onboarding plan"),
    ("p", "What each stage of your onboarding covers, and who runs it:"),
    (
        "table",
        [
            ["Week", "Focus", "Run by"],
            ["1", "Accounts, the welcome session, meeting your team", "Your manager"],
            ["2", "Product training and a half-day farm visit with an agronomist", "Agronomy"],
            ["3-4", "Your first project and goals for your first 90 days", "Your manager"],
            ["6", "New starters' lunch with the CEO, Maya Okafor", "PeopleOps"],
            ["8", "Onboarding survey (10 minutes, anonymous)", "PeopleOps"],
        ],
    ),
    ("h1", "Probation and check-ins"),
    ("h2", "Check-ins"),
    (
        "p",
        "You meet your manager for a check-in after 30, 60 and 90 days. Each check-in looks "
        "back at your goals and agrees what comes next; your manager records it in PeopleHub.",
    ),
    ("h2", "Probation"),
    (
        "p",
        "Probation lasts 90 days in both offices, and 180 days for senior and management roles "
        "in Lisbon. Either side may end employment with one week's notice during probation.",
    ),
]
GUIDE_COMMENT = (
    "Before your first day",  # the heading the comment is anchored to
    "Hannah Lindqvist",
    "Check with Tomás whether engineering in Lisbon still ships laptops to new starters' homes.",
)


def make_docx(path: Path) -> None:
    import docx

    document = docx.Document()
    props = document.core_properties
    props.title = GUIDE_TITLE
    props.author = "People Operations"
    props.last_modified_by = "People Operations"
    props.created = props.modified = WRITTEN
    props.revision = 1
    document.add_heading(GUIDE_TITLE, level=0)
    document.add_paragraph(GUIDE_INTRO)
    for kind, content in GUIDE:
        if kind in ("h1", "h2"):
            heading = document.add_heading(content, level=int(kind[1]))
            if content == GUIDE_COMMENT[0]:
                _, author, text = GUIDE_COMMENT
                initials = "".join(word[0] for word in author.split())
                comment = document.add_comment(
                    heading.runs, text=text, author=author, initials=initials
                )
                # python-docx stamps the comment with the current time.
                comment._comment_elm.date = WRITTEN
        elif kind == "p":
            document.add_paragraph(content)
        elif kind == "li":
            document.add_paragraph(content, style="List Bullet")
        elif kind == "table":
            table = document.add_table(rows=len(content), cols=len(content[0]))
            table.style = "Table Grid"
            for row, values in zip(table.rows, content, strict=True):
                for cell, value in zip(row.cells, values, strict=True):
                    cell.text = value
    document.save(str(path))


# ----------------------------------------------------------------------------- PowerPoint
DECK_TITLE = "Customer Support Playbook"
# title, bullets (a tuple is a bullet one level in), table rows, speaker notes
SLIDES: list[dict[str, Any]] = [
    {
        "title": DECK_TITLE,
        "subtitle": "How Brightwater Labs helps farmers when something breaks, 2026 edition",
        "notes": "Welcome new support agents. This deck is the first session of support "
        "onboarding; the help desk training follows in the afternoon.",
    },
    {
        "title": "Support hours and channels",
        "bullets": [
            "Phone and chat: Monday to Friday, 6:00 to 18:00 Pacific time",
            "Irrigation season (April to September): Saturday phone support, 7:00 to 13:00 "
            "Pacific time",
            "Email to support@brightwater.example: answered within one business day",
            "Farm Care Plus customers: a 24/7 emergency line for gateway outages",
        ],
        "notes": "The Lisbon team covers the morning shift and the Portland team the "
        "afternoon. The handover is at 11:00 Pacific time in the shared support channel.",
    },
    {
        "title": "Response-time targets",
        "table": [
            ["Support plan", "First response", "Workaround within", "Price per farm"],
            ["Standard", "1 business day", "10 business days", "Included"],
            ["Farm Care", "4 business hours", "3 business days", "$240 per year"],
            ["Farm Care Plus", "1 hour, 24/7", "1 day", "$690 per year"],
        ],
        "notes": "Farm Care and Farm Care Plus customers also get 20% off field service "
        "rates. In 2025 we met the Farm Care first-response target on 96% of tickets.",
    },
    {
        "title": "Escalation path",
        "bullets": [
            "Tier 1, support agents: answer, troubleshoot remotely, open a return (RMA)",
            "Tier 2, field engineers:",
            ("a ticket still open after 4 hours",),
            ("any outage of a gateway serving more than 20 sensors",),
            "Tier 3, the firmware team in Lisbon: bugs that Tier 2 has reproduced",
            "Suspected security issues go straight to security@brightwater.example",
        ],
        "notes": "Any agent may approve a refund or credit of up to $250. Above that, ask the "
        "support lead, Priya Nair.",
    },
    {
        "title": "Returns and warranty",
        "bullets": [
            "Warranty: 3 years on sensors and gateways, 1 year on accessories",
            "Unused items can be returned within 45 days for a full refund",
            "Every return needs an RMA number from the help desk before it is shipped",
            "Replacements ship within three business days of an approved RMA",
        ],
        "notes": "Customers pay the shipping for unused returns; Brightwater Labs pays it for "
        "warranty claims.",
    },
]


def make_pptx(path: Path) -> None:
    from pptx import Presentation
    from pptx.util import Inches

    deck = Presentation()
    props = deck.core_properties
    props.title = DECK_TITLE
    props.author = "Customer Support"
    props.last_modified_by = "Customer Support"
    props.created = props.modified = WRITTEN
    props.revision = 1
    title_slide, bullets_slide, title_only = (deck.slide_layouts[i] for i in (0, 1, 5))
    for spec in SLIDES:
        if "subtitle" in spec:
            slide = deck.slides.add_slide(title_slide)
            slide.placeholders[1].text = spec["subtitle"]
        elif "table" in spec:
            slide = deck.slides.add_slide(title_only)
            rows = spec["table"]
            shape = slide.shapes.add_table(
                len(rows), len(rows[0]), Inches(0.5), Inches(1.8), Inches(9), Inches(2.4)
            )
            for row, values in zip(shape.table.rows, rows, strict=True):
                for cell, value in zip(row.cells, values, strict=True):
                    cell.text = value
        else:
            slide = deck.slides.add_slide(bullets_slide)
            frame = slide.placeholders[1].text_frame
            for i, bullet in enumerate(spec["bullets"]):
                paragraph = frame.paragraphs[0] if i == 0 else frame.add_paragraph()
                if isinstance(bullet, tuple):
                    paragraph.text, paragraph.level = bullet[0], 1
                else:
                    paragraph.text = bullet
        slide.shapes.title.text = spec["title"]
        slide.notes_slide.notes_text_frame.text = spec["notes"]
    deck.save(str(path))


# ----------------------------------------------------------------------------- Excel
RATES_TITLE = "Brightwater Labs field service rates 2026"
# The Farm Care rate is the standard rate less this discount (a formula in the sheet).
FARM_CARE_DISCOUNT = 0.2
# Two header rows: "Rate" is merged over "Standard" and "Farm Care"; the other headers are
# merged down over both rows.
HEADER = ["Code", "Service", "Unit", "Currency", "Rate", None, "On site", "Lead time (days)"]
SUBHEADER = [None, None, None, None, "Standard", "Farm Care", None, None]
# code, service, unit, standard rate, discounted (False: travel is charged at cost), on site,
# lead time in days (None: not booked on its own)
RATES: dict[str, tuple[str, list[tuple[Any, ...]]]] = {
    "EU": (
        "EUR",
        [
            ("SV-01", "Soil probe installation", "per probe", 45, True, True, 5),
            ("SV-02", "Field Gateway installation and setup", "per gateway", 180, True, True, 10),
            ("SV-03", "WeatherMast Station installation", "per station", 260, True, True, 10),
            ("SV-04", "Sensor calibration", "per sensor", 18, True, True, 15),
            ("SV-05", "Irrigation schedule review (remote)", "per farm", 95, True, False, 3),
            ("SV-06", "Emergency visit within 48 hours", "per visit", 320, True, True, 2),
            (
                "SV-07",
                "Travel beyond 50 km from a service partner",
                "per km",
                0.6,
                False,
                True,
                None,
            ),
        ],
    ),
    "US": (
        "USD",
        [
            ("SV-01", "Soil probe installation", "per probe", 49, True, True, 5),
            ("SV-02", "Field Gateway installation and setup", "per gateway", 195, True, True, 7),
            ("SV-03", "WeatherMast Station installation", "per station", 285, True, True, 7),
            ("SV-04", "Sensor calibration", "per sensor", 20, True, True, 10),
            ("SV-05", "Irrigation schedule review (remote)", "per farm", 99, True, False, 3),
            ("SV-06", "Emergency visit within 48 hours", "per visit", 350, True, True, 2),
            (
                "SV-07",
                "Travel beyond 30 miles from a service partner",
                "per mile",
                1.1,
                False,
                True,
                None,
            ),
        ],
    ),
}


def make_xlsx(path: Path) -> None:
    # XlsxWriter, not openpyxl: it saves a formula's value with the formula, as Excel does,
    # and a reader that does not calculate (ingest included) sees the value.
    import xlsxwriter

    book = xlsxwriter.Workbook(str(path))
    book.set_properties({"title": RATES_TITLE, "author": "Customer Support", "created": WRITTEN})
    bold = book.add_format({"bold": True, "align": "center", "valign": "vcenter", "border": 1})
    money = book.add_format({"num_format": "#,##0.00"})
    for sheet_name, (currency, rows) in RATES.items():
        sheet = book.add_worksheet(sheet_name)
        sheet.set_column("A:A", 8)
        sheet.set_column("B:B", 44)
        sheet.set_column("C:H", 12)
        for column, (top, below) in enumerate(zip(HEADER, SUBHEADER, strict=True)):
            if top is None:
                continue
            if below is None:
                sheet.merge_range(0, column, 1, column, top, bold)
            else:
                sheet.merge_range(0, column, 0, column + 1, top, bold)
        for column, below in enumerate(SUBHEADER):
            if below is not None:
                sheet.write(1, column, below, bold)
        for offset, (code, service, unit, rate, discounted, on_site, lead) in enumerate(rows):
            row = offset + 2
            sheet.write_string(row, 0, code)
            sheet.write_string(row, 1, service)
            sheet.write_string(row, 2, unit)
            sheet.write_string(row, 3, currency)
            sheet.write_number(row, 4, rate, money)
            standard = xlsxwriter.utility.xl_rowcol_to_cell(row, 4)
            if discounted:
                farm_care = round(rate * (1 - FARM_CARE_DISCOUNT), 2)
                formula = f"=ROUND({standard}*(1-{FARM_CARE_DISCOUNT}),2)"
            else:
                farm_care, formula = rate, f"={standard}"
            sheet.write_formula(row, 5, formula, money, farm_care)
            sheet.write_boolean(row, 6, on_site)
            if lead is not None:
                sheet.write_number(row, 7, lead)
    book.close()


# ----------------------------------------------------------------------------- the scan
NOTICE_TITLE = "Portland office: fire safety, first aid and building access"
# One list of (heading, paragraph) per page; the first page opens with the letterhead.
NOTICE_PAGES = [
    [
        (
            "Brightwater Labs - Facilities notice",
            "Portland office: fire safety, first aid and building access. Issued by "
            "Facilities on 2 February 2026. Please read it and keep it at your desk.",
        ),
        (
            "Fire alarm",
            "When the fire alarm sounds, leave the building at once by the nearest stairway. "
            "Do not use the elevators and do not stop to collect your belongings.",
        ),
        (
            "Assembly point",
            "Gather at the assembly point in the east parking lot, next to the bicycle "
            "shelter. Report to the fire warden of your floor there, so that nobody is "
            "searched for by mistake.",
        ),
        (
            "Fire wardens",
            "Each floor has two fire wardens, who wear orange vests during an alarm. The "
            "current wardens are listed on the board next to the kitchen of every floor.",
        ),
        (
            "Fire drills",
            "Fire drills take place twice a year, in March and September, on a weekday "
            "morning without notice.",
        ),
    ],
    [
        (
            "First aid",
            "First-aid kits are kept in every kitchen and at reception. A defibrillator (AED) "
            "hangs next to the reception desk on the ground floor. Twelve employees are "
            "trained first aiders; their names are on the kitchen boards.",
        ),
        (
            "Building access",
            "The office is open from 7:00 to 20:00 on weekdays. Outside these hours and at "
            "weekends your badge opens the doors only after Facilities has registered it for "
            "after-hours access. Visitors sign in at reception and wear a visitor badge at "
            "all times.",
        ),
        (
            "Lost badges",
            "Report a lost badge to facilities@brightwater.example on the day you lose it. "
            "Reception issues a replacement within one business day.",
        ),
        (
            "Questions",
            "Ask Daniel Brooks, Facilities Manager, Portland, at extension 4120.",
        ),
    ],
]
DPI = 300
PAGE_PIXELS = (2480, 3508)  # A4 at 300 dpi
MARGIN = 250
FONTS = Path("/usr/share/fonts/truetype/liberation")
SEED = 2026


def _wrap(draw: ImageDraw.ImageDraw, text: str, font: Any, width: int) -> list[str]:
    lines: list[str] = []
    line = ""
    for word in text.split():
        candidate = f"{line} {word}".strip()
        if line and draw.textlength(candidate, font=font) > width:
            lines.append(line)
            line = word
        else:
            line = candidate
    return [*lines, line] if line else lines


def _scan_page(sections: list[tuple[str, str]], number: int, rng: np.random.Generator) -> Any:
    """A page as a scanner in document mode gives it: typeset at 300 dpi, turned a little,
    with specks and ragged edges, then cut to black and white."""
    page = Image.new("L", PAGE_PIXELS, 255)
    draw = ImageDraw.Draw(page)
    heading = ImageFont.truetype(str(FONTS / "LiberationSans-Bold.ttf"), 54)  # 13 pt
    body = ImageFont.truetype(str(FONTS / "LiberationSerif-Regular.ttf"), 48)  # 11.5 pt
    width = PAGE_PIXELS[0] - 2 * MARGIN
    y = MARGIN
    for title, text in sections:
        draw.text((MARGIN, y), title, font=heading, fill=0)
        y += 90
        for line in _wrap(draw, text, body, width):
            draw.text((MARGIN, y), line, font=body, fill=0)
            y += 66
        y += 60
    footer = f"Facilities notice, Portland - page {number} of {len(NOTICE_PAGES)}"
    draw.text((MARGIN, PAGE_PIXELS[1] - MARGIN), footer, font=body, fill=0)
    angle = float(rng.uniform(-0.8, 0.8))
    page = page.rotate(angle, resample=Image.Resampling.BICUBIC, fillcolor=255)
    pixels = np.asarray(page, dtype=np.float32)
    pixels = pixels + rng.normal(0, 18, pixels.shape)
    specks = rng.random(pixels.shape) < 0.0003
    pixels[specks] = 0
    return Image.fromarray(pixels.clip(0, 255).astype(np.uint8), "L").point(
        lambda value: 255 if value > 140 else 0, mode="1"
    )


def make_scan(path: Path) -> None:
    rng = np.random.default_rng(SEED)
    pages = [_scan_page(sections, n, rng) for n, sections in enumerate(NOTICE_PAGES, start=1)]
    stamp = WRITTEN.timetuple()
    # Pillow writes black-and-white pages as CCITT group 4, as scanners do: 50 KB a page.
    pages[0].save(
        path,
        "PDF",
        save_all=True,
        append_images=pages[1:],
        resolution=DPI,
        title=NOTICE_TITLE,
        author=AUTHOR,
        creationDate=stamp,
        modDate=stamp,
    )


# ----------------------------------------------------------------------------- output
def _fix_zip_times(path: Path) -> None:
    """Rewrite an Office file with every part dated ``WRITTEN``: the libraries stamp the zip
    entries with the time they are written, and the same text would make new bytes."""
    with zipfile.ZipFile(path) as archive:
        parts = [(info.filename, archive.read(info)) for info in archive.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in parts:
            info = zipfile.ZipInfo(name, date_time=WRITTEN.timetuple()[:6])
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)


def main() -> None:
    outputs = [
        (SAMPLES / "handbook" / "onboarding-guide.docx", make_docx, True),
        (SAMPLES / "support" / "support-playbook.pptx", make_pptx, True),
        (SAMPLES / "catalog" / "service-rates.xlsx", make_xlsx, True),
        (SAMPLES / "scans" / "office-safety-notice.pdf", make_scan, False),
    ]
    for path, make, zipped in outputs:
        path.parent.mkdir(parents=True, exist_ok=True)
        make(path)
        if zipped:
            _fix_zip_times(path)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
