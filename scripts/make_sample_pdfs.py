"""Regenerate samples/policies/*.pdf from the text below (needs the dev extra: fpdf2).

The PDFs are committed so the quickstart needs nothing beyond the runtime dependencies;
run `python scripts/make_sample_pdfs.py` after editing the text here.
"""

from __future__ import annotations

from pathlib import Path

from fpdf import FPDF

OUT = Path(__file__).resolve().parent.parent / "samples" / "policies"

DOCUMENTS = {
    "travel-policy.pdf": (
        "Brightwater Labs Travel Policy",
        [
            (
                "1. Booking travel",
                "Book all flights, trains and hotels through the company travel portal at least "
                "14 days before departure. Trips that cost more than $2,500 in total need approval "
                "from your department head before booking. Economy class is the default for all "
                "flights; premium economy is allowed for flights longer than eight hours.",
            ),
            (
                "2. Hotels",
                "Hotel costs are reimbursed up to $220 per night in the United States and up to "
                "EUR 180 per night in Europe. Choose hotels within 30 minutes of the meeting "
                "place. Loyalty points earned on business trips are yours to keep.",
            ),
            (
                "3. Meals and per diem",
                "While travelling you receive a per diem of $65 per day for meals, or $40 on the "
                "first and last day of a trip. Alcohol is not reimbursed, except at client "
                "dinners approved by your manager.",
            ),
            (
                "4. Ground transport",
                "Use public transport where practical. Taxis and ride-hailing are reimbursed "
                "between airports, hotels and meeting places. Rental cars need approval and must "
                "be the compact class unless you travel with three or more colleagues.",
            ),
            (
                "5. Travel insurance and safety",
                "All business trips are covered by the company travel insurance. Register each "
                "trip in the travel portal so the safety team can reach you. In an emergency call "
                "the 24-hour assistance line printed on the back of your insurance card.",
            ),
        ],
    ),
    "security-policy.pdf": (
        "Brightwater Labs Information Security Policy",
        [
            (
                "Passwords and accounts",
                "Use the company password manager for every work account. Passwords must be at "
                "least 14 characters long and unique. Multi-factor authentication is mandatory "
                "for email, the code repository and the cloud console.",
            ),
            (
                "Devices",
                "Company laptops must use full-disk encryption, automatic screen lock after five "
                "minutes and the managed antivirus. Install operating system updates within seven "
                "days of release. Personal devices may only access email and chat, and only with "
                "the device management profile installed.",
            ),
            (
                "Data classification",
                "Customer farm data is confidential. It may be stored only in the production "
                "cloud account and never on laptops or personal cloud drives. Share confidential "
                "documents only with named people, never with a public link.",
            ),
            (
                "Incident reporting",
                "Report suspected phishing, malware, lost devices or data leaks immediately, and "
                "within 24 hours at the latest, to security@brightwater.example. Do not try to "
                "investigate an incident yourself. The security team answers reports around the "
                "clock.",
            ),
        ],
    ),
}


def render(title: str, sections: list[tuple[str, str]], path: Path) -> None:
    pdf = FPDF(format="A4")
    pdf.set_title(title)
    pdf.set_author("Brightwater Labs")
    pdf.set_auto_page_break(auto=True, margin=20)
    # Two sections a page, so the samples exercise page numbers in citations.
    for i, (heading, body) in enumerate(sections):
        if i % 2 == 0:
            pdf.add_page()
            if i == 0:
                pdf.set_font("Helvetica", "B", 16)
                pdf.multi_cell(0, 10, title, new_x="LMARGIN", new_y="NEXT")
                pdf.ln(4)
        pdf.set_font("Helvetica", "B", 13)
        pdf.multi_cell(0, 8, heading, new_x="LMARGIN", new_y="NEXT")
        pdf.set_font("Helvetica", size=11)
        pdf.multi_cell(0, 6, body, new_x="LMARGIN", new_y="NEXT")
        pdf.ln(4)
    pdf.output(str(path))


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (title, sections) in DOCUMENTS.items():
        render(title, sections, OUT / name)
        print(f"wrote {OUT / name}")


if __name__ == "__main__":
    main()
