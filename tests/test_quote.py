"""The quote style's parts without a model: sources cut into quotable units, the shortlist
the model chooses from, and the GBNF that holds it to copying (checked by llama.cpp's own
grammar parser where it matters)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from langchain_core.documents import Document

from ragchains.chains.answer import DONT_KNOW, create_answer_chain, parse_citations
from ragchains.chains.llm import LLM
from ragchains.chains.quote import (
    MAX_QUOTE_CHARS,
    Quote,
    QuoteWriter,
    cells,
    gbnf_literal,
    lead,
    quote_grammar,
    quotes,
    sentences_of,
    shortlist,
    split_sentences,
    units_of,
)
from ragchains.evaluation.metrics import faithful_sentences
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.searchindex import load_index
from tests.fakes import RecordingModel


@pytest.fixture(scope="module")
def sample_chunks(sample_index: Path, embedder: SentenceTransformerEmbedder) -> list[Document]:
    index = load_index(sample_index)
    try:
        return [
            Document(page_content=c.text, metadata=c.metadata) for c in index.store.iter_chunks()
        ]
    finally:
        index.close()


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Markdown: the heading is not quoted; hard-wrapped lines are joined.
        (
            "## Paid time off  \nFull-time employees receive 25 days of paid time off, accrued\n"
            "monthly. Up to 5 unused days carry over; the rest expire on 31 March.",
            [
                "Full-time employees receive 25 days of paid time off, accrued monthly.",
                "Up to 5 unused days carry over; the rest expire on 31 March.",
            ],
        ),
        # A table: each row one unit; the header row (context) and the |---| rule left out.
        (
            "Plans below.\n| Plan | Cost |\n|------|------|\n| Basic | $0.00 |\n"
            "| Standard | $45.00 |",
            ["Plans below.", "| Basic | $0.00 |", "| Standard | $45.00 |"],
        ),
        # List items, bullets and numbers dropped; an item may wrap onto the next line.
        (
            "Open positions:\n- Senior Firmware Engineer, Lisbon: embedded C.\n"
            "- Agronomist, Portland: turns sensor data into\n  irrigation schedules.\n"
            "2) Support Specialist, remote.",
            [
                "Open positions:",
                "Senior Firmware Engineer, Lisbon: embedded C.",
                "Agronomist, Portland: turns sensor data into irrigation schedules.",
                "Support Specialist, remote.",
            ],
        ),
        # Lettered items; a line starting with an initial is a sentence, not an item.
        (
            "(a) Book early.\nb) Keep receipts.\nJ. Smith approves trips.",
            ["Book early.", "Keep receipts.", "J. Smith approves trips."],
        ),
        # A CSV or JSON row as ingest writes it: one record, one unit.
        (
            "sku: BW-730\nname: Probe Auger\nprice: 34.0\ndescription: Drills a hole. Fast.",
            ["sku: BW-730 name: Probe Auger price: 34.0 description: Drills a hole. Fast."],
        ),
        # Two records in one chunk: a repeated field starts the next.
        (
            "sku: A-1\nprice: 3\nsku: B-2\nprice: 4",
            ["sku: A-1 price: 3", "sku: B-2 price: 4"],
        ),
        # A single "name: value" line is prose, split into sentences as prose is.
        (
            "We have two offices: Portland and Lisbon, opened in 2019. About 140 people work here.",
            [
                "We have two offices: Portland and Lisbon, opened in 2019.",
                "About 140 people work here.",
            ],
        ),
        # PDF text: short lines without an ending before a capitalised line are headings.
        (
            "Brightwater Travel Policy\n3. Meals and per diem\nWhile travelling you receive "
            "$65 per day. Alcohol is\nnot reimbursed.\nGround transport\nUse public transport.",
            [
                "While travelling you receive $65 per day.",
                "Alcohol is not reimbursed.",
                "Use public transport.",
            ],
        ),
        # Abbreviations, initials and decimals do not end a sentence; quotes may close one.
        (
            'Claim e.g. a desk in the U.S. or EU. J. Smith approves $45.00 items. Choose "Forgot '
            'password". You need your phone!',
            [
                "Claim e.g. a desk in the U.S. or EU.",
                "J. Smith approves $45.00 items.",
                'Choose "Forgot password".',
                "You need your phone!",
            ],
        ),
        # A FAQ's questions are not answers.
        (
            "How do I reset my password?\nOpen the portal. Choose Forgot password.",
            ["Open the portal.", "Choose Forgot password."],
        ),
    ],
)
def test_sources_are_cut_into_quotable_units(text: str, expected: list[str]) -> None:
    units = sentences_of(text)
    assert units == expected
    for unit in units:
        assert unit in _flat(text)  # verbatim, whitespace collapsed


def test_long_sentences_are_cut_at_clauses_and_stay_verbatim() -> None:
    clause = "the policy covers travel, meals and lodging for every trip abroad"
    text = "; ".join([clause] * 12) + "."
    units = sentences_of(text)
    assert len(units) > 1 and all(len(u) <= MAX_QUOTE_CHARS for u in units)
    assert all(u in text for u in units)
    assert " ".join(units) == text  # nothing lost between the pieces
    word = "x" * (MAX_QUOTE_CHARS * 2 + 5)
    assert [len(u) for u in sentences_of(word)] == [MAX_QUOTE_CHARS, MAX_QUOTE_CHARS, 5]


def test_units_carry_their_heading_and_table_header() -> None:
    text = "| Plan | Monthly cost |\n|---|---|\n| Standard | $45.00 |\nAdding children costs $30."
    units = units_of(text, section="Benefit plans")
    assert units[0].text == "| Standard | $45.00 |"
    assert units[0].context == "Benefit plans | Plan | Monthly cost |"
    assert units[1].context == "Benefit plans"
    faq = units_of("Which VPN should I use?\nUse the WireGuard profile.")
    assert faq[0].context == "Which VPN should I use?"


def test_split_sentences_keeps_everything() -> None:
    text = "One. Two! Three? four. Five"
    assert split_sentences(text) == ["One.", "Two!", "Three? four.", "Five"]


DOCS = [
    Document(
        page_content="## Hotels\nHotels are reimbursed up to $220 per night. Book early.",
        metadata={"citation": "travel.pdf#page=1", "section": "Travel > Hotels"},
    ),
    Document(
        page_content="The company pays the rest. Hotels are reimbursed up to $220 per night.",
        metadata={"citation": "faq.md#travel"},
    ),
    Document(
        page_content="| Plan | Monthly cost |\n|---|---|\n| Standard | $45.00 |",
        metadata={"citation": "handbook.md#plans", "section": "Benefit plans"},
    ),
]
LABELS = [d.metadata["citation"] for d in DOCS]


def test_quotes_are_unique_with_every_label_that_holds_them() -> None:
    found = quotes(DOCS, LABELS)
    assert [q.text for q in found] == [
        "Hotels are reimbursed up to $220 per night.",
        "Book early.",
        "The company pays the rest.",
        "| Standard | $45.00 |",
    ]
    assert found[0].labels == ("travel.pdf#page=1", "faq.md#travel")


def test_shortlist_offers_the_units_that_share_the_question_words() -> None:
    found = quotes(DOCS, LABELS)
    top = shortlist(found, "How much are hotels reimbursed per night?")
    assert [q.text for q in top] == ["Hotels are reimbursed up to $220 per night."]
    # A table row is found through its header: "monthly cost" is only in the header.
    plan = shortlist(found, "What is the monthly cost of the standard plan?", within=0.5)
    assert plan[0].text == "| Standard | $45.00 |"
    # Asking words are not what is asked about: "what" matches nothing here.
    asked = quotes([Document(page_content="That is what we do. Hotels cost $9.")], ["x"])
    assert [q.text for q in shortlist(asked, "What do hotels cost?")] == ["Hotels cost $9."]
    # No shared word: the chunks' own order (the compressor's, best first), up to the limit.
    assert shortlist(found, "zebra?", limit=2) == found[:2]
    assert len(shortlist(found, "hotels night", limit=1)) == 1


def test_grammar_offers_quotes_with_their_labels_or_the_dont_know_sentence() -> None:
    found = [
        Quote("Hotels are reimbursed up to $220 per night.", ("a.pdf#page=1", "b.md#x")),
        Quote("| Standard | $45.00 |", ("b.md#x",)),
    ]
    grammar = quote_grammar(found, DONT_KNOW, sentences=2)
    assert grammar.splitlines() == [
        "root ::= dontknow | r",
        f'dontknow ::= "{DONT_KNOW}"',
        'r ::= q0 (" " r0)? | q1 (" " r1)?',  # a second quote may follow, never the same one
        "r0 ::= q1",
        "r1 ::= q0",
        'q0 ::= "Hotels are reimbursed up to $220 per night." (l0 | l1)',
        'q1 ::= "| Standard | $45.00 |" l1',
        'l0 ::= " [a.pdf#page=1]"',
        'l1 ::= " [b.md#x]"',
    ]
    assert "r ::= q0 | q1\n" in quote_grammar(found, DONT_KNOW)  # one quote
    three = quote_grammar([*found, Quote("Book early.", ("c",))], DONT_KNOW, sentences=3)
    assert 'r0 ::= q1 (" " r0-1)? | q2 (" " r0-2)?\nr0-1 ::= q2\n' in three
    assert quote_grammar([], DONT_KNOW) == f'root ::= "{DONT_KNOW}"\n'


@pytest.mark.parametrize(
    ("text", "literal"),
    [
        ('say "hi"', '"say \\"hi\\""'),
        ("C:\\temp\\new", '"C:\\\\temp\\\\new"'),
        ("a\nb\tc\rd", '"a\\nb\\tc\\rd"'),
        ("bell\x07 del\x7f", '"bell\\x07 del\\x7F"'),
        ("Tomás 25 €", '"Tom\\u00E1s 25 \\u20AC"'),
        ("ok 👍", '"ok \\U0001F44D"'),
        ("[x] - y", '"[x] - y"'),
    ],
)
def test_literals_are_escaped_for_gbnf(text: str, literal: str) -> None:
    assert gbnf_literal(text) == literal
    assert gbnf_literal(text).isascii()


def test_llama_cpp_compiles_the_grammar_and_decodes_the_escapes(smollm: object) -> None:
    """llama.cpp's own parser reads every escape; the model can then write the text."""
    import llama_cpp

    vocab = smollm.model.model.client._model.vocab  # type: ignore[attr-defined]
    awkward = 'He said "Tomás paid €25 (C:\\temp) 👍".\tDone'
    found = [Quote(awkward, ('odd "label"\\#1',)), Quote("Plain.", ("p.md",))]
    grammar = quote_grammar(found, DONT_KNOW, sentences=2)
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    assert sampler, grammar
    llama_cpp.llama_sampler_free(sampler)
    bad = llama_cpp.llama_sampler_init_grammar(vocab, b'root ::= "a\\q"\n', b"root")
    assert not bad  # the check above would notice a broken escape
    # The model, held to a grammar of the awkward quote alone, writes it back exactly.
    only = f'root ::= {gbnf_literal(awkward)} " [x.md]"\n'
    written = smollm.bound(temperature=0.0, max_tokens=80, grammar=only).invoke(  # type: ignore[attr-defined]
        "Repeat: " + awkward
    )
    assert written.content == f"{awkward} [x.md]"


def test_every_unit_of_the_sample_corpus_is_verbatim(sample_chunks: list[Document]) -> None:
    for chunk in sample_chunks:
        flat = _flat(chunk.page_content)
        for unit in sentences_of(chunk.page_content):
            assert unit in flat and len(unit) <= MAX_QUOTE_CHARS
            assert not re.match(r"#{1,6} ", unit)  # no Markdown heading


# ----------------------------------------------------------------------------- display
PLANS = Document(
    page_content=(
        "## Benefit plans\nThree plans.\n"
        "| Plan | Monthly cost | Deductible |\n|------|-------------:|:----------:|\n"
        "| Basic | $0.00 | $3,000 |\n| Standard | $45.00 | $1,000 |\n| Premium | $120.00 | $250 |\n"
        "Adding a spouse doubles the monthly cost."
    ),
    metadata={"citation": "handbook.md#benefit-plans", "section": "Handbook > Benefit plans"},
)
# The next chunk starts inside the table (the overlap): its row has no header of its own.
PLANS_AFTER = Document(
    page_content="| Premium | $120.00 | $250 |\nChildren cost $30.00 per month.",
    metadata={"citation": "handbook.md#benefit-plans", "section": "Handbook > Benefit plans"},
)
PROBE = Document(
    page_content=(
        "sku: BW-100\nname: AquaSense Soil Probe\nprice: 89.00\n"
        "description: Measures *soil* moisture; [new]."
    ),
    metadata={"citation": "products.csv#row=1", "row": 1},
)
HEAD = "| Plan | Monthly cost | Deductible |\n| --- | ---: | :---: |"


def _shown(found: list[Quote], reply: str) -> tuple[str, list[str]]:
    """The answer shown for ``reply`` streamed one character at a time, and its parts."""
    writer = QuoteWriter(found)
    parts = [writer.add(char) for char in reply] + [writer.close()]
    shown = "".join(parts)
    assert shown == writer.render(reply)  # the streamed parts add up to the whole
    return shown, [p for p in parts if p]


def test_units_know_their_kind_table_head_and_fields() -> None:
    units = units_of(PLANS.page_content)
    rows = [u for u in units if u.kind == "row"]
    assert [u.text for u in rows] == [
        "| Basic | $0.00 | $3,000 |",
        "| Standard | $45.00 | $1,000 |",
        "| Premium | $120.00 | $250 |",
    ]
    # The header row, and a compact rule keeping the source's alignment.
    assert {u.table for u in rows} == {HEAD}
    assert units[-1].kind == "prose" and units[-1].table == ""
    (record,) = units_of(PROBE.page_content)
    assert record.kind == "record" and record.fields == (
        ("sku", "BW-100"),
        ("name", "AquaSense Soil Probe"),
        ("price", "89.00"),
        ("description", "Measures *soil* moisture; [new]."),
    )
    assert cells("| a | b \\| c |") == ["a", "b \\| c"]


def test_a_quoted_row_is_shown_under_its_table_header_with_the_citation_after() -> None:
    found = quotes([PLANS], ["handbook.md#benefit-plans"])
    shown, parts = _shown(found, "| Standard | $45.00 | $1,000 | [handbook.md#benefit-plans]")
    assert shown == (f"{HEAD}\n| Standard | $45.00 | $1,000 |\n\n[handbook.md#benefit-plans]")
    # The table shows once its row is whole; its citation once no other row can follow.
    assert parts == [f"{HEAD}\n| Standard | $45.00 | $1,000 |", "\n\n[handbook.md#benefit-plans]"]
    assert [c.label for c in parse_citations(shown, [PLANS])] == ["handbook.md#benefit-plans"]
    assert _table_lines(shown) == 4  # header, rule and row: the marker is no fourth row


def _table_lines(markdown: str) -> int:
    """The lines of the first GFM table: from the header to the first blank line."""
    block = markdown.split("\n\n")[0].splitlines()
    assert all(line.startswith("|") and line.endswith("|") for line in block)
    assert re.fullmatch(r"\|( :?---:? \|)+", block[1])
    widths = {len(cells(line)) for line in block}
    assert len(widths) == 1, block  # every line as wide as the header
    return len(block) + 1


def test_two_rows_of_one_table_share_its_header() -> None:
    found = quotes([PLANS], ["handbook.md#benefit-plans"])
    reply = (
        "| Basic | $0.00 | $3,000 | [handbook.md#benefit-plans] "
        "| Premium | $120.00 | $250 | [handbook.md#benefit-plans]"
    )
    shown, _ = _shown(found, reply)
    assert shown == (
        f"{HEAD}\n| Basic | $0.00 | $3,000 |\n| Premium | $120.00 | $250 |\n\n"
        "[handbook.md#benefit-plans]"
    )


def test_a_row_without_its_header_borrows_it_from_a_chunk_of_its_section() -> None:
    labels = ["handbook.md#benefit-plans"] * 2
    # The headerless chunk ranked first: the row is still shown under the header.
    found = quotes([PLANS_AFTER, PLANS], labels)
    premium = next(q for q in found if q.text == "| Premium | $120.00 | $250 |")
    assert premium.table == HEAD
    # Alone, it gets an empty header row as wide as itself (GFM needs one).
    (alone, _) = quotes([PLANS_AFTER], labels[:1])
    assert alone.table == ""
    shown, _ = _shown([alone], "| Premium | $120.00 | $250 | [handbook.md#benefit-plans]")
    assert shown.startswith("| | | |\n| --- | --- | --- |\n| Premium | $120.00 | $250 |\n\n[")


def test_a_record_is_shown_as_field_value_lines() -> None:
    found = quotes([PROBE], ["products.csv#row=1"])
    shown, parts = _shown(found, f"{found[0].text} [products.csv#row=1]")
    assert shown == (
        "- **sku:** BW-100\n- **name:** AquaSense Soil Probe\n- **price:** 89.00\n"
        "- **description:** Measures \\*soil\\* moisture; \\[new\\].\n\n[products.csv#row=1]"
    )
    assert len(parts) == 1  # shown once written whole
    cited = parse_citations(shown, [PROBE])
    assert [c.label for c in cited] == ["products.csv#row=1"]


def test_sentences_stream_as_written_and_blocks_are_set_apart() -> None:
    found = quotes([PLANS, PROBE], ["handbook.md#benefit-plans", "products.csv#row=1"])
    plain = "Three plans. [handbook.md#benefit-plans]"
    shown, parts = _shown(found, plain)
    assert shown == plain and len(parts) > 10  # token by token, unchanged
    # A sentence that names nothing of its section is shown under the section's heading,
    # streamed as written from its first letter (the only quote that starts so).
    sentence = "Adding a spouse doubles the monthly cost. [handbook.md#benefit-plans]"
    shown, parts = _shown(found, sentence)
    assert shown == f"**Benefit plans:** {sentence}" and len(parts) > 10
    reply = f"{plain} | Basic | $0.00 | $3,000 | [handbook.md#benefit-plans] {sentence} Two. [x]"
    shown, _ = _shown(found, reply)
    assert shown == (
        f"{plain}\n\n{HEAD}\n| Basic | $0.00 | $3,000 |\n\n[handbook.md#benefit-plans]"
        f"\n\n**Benefit plans:** {sentence}"
        "\n\nTwo. [x]"  # no offered quote: as written
    )


def test_a_quote_waits_for_its_lead_until_the_model_has_chosen() -> None:
    doc = Document(
        page_content="## min_search_length\nThe min_search_length is 3 by default.\n"
        "The minimum length of a search query, an integer.",
        metadata={"citation": "configuration.md#search"},
    )
    found = quotes([doc], ["configuration.md#search"])
    assert [lead(q) for q in found] == ["", "min_search_length"]
    writer = QuoteWriter(found)
    assert writer.add("The min") == ""  # either quote: with its lead or without
    chosen = "The minimum length of a search query, an integer. [configuration.md#search]"
    parts = [writer.add(char) for char in chosen[7:]] + [writer.close()]
    assert parts[0] == "**min_search_length:** The mini" and "".join(parts) == (
        f"**min_search_length:** {chosen}"
    )
    shown = "".join(parts)
    # A bold line read as the heading leads without its stars; a code fence leads nothing.
    bold = Document(page_content="**dev_addr**\nThe address `mkdocs serve` uses.")
    assert [lead(q) for q in quotes([bold], ["c.md"])] == ["dev_addr"]
    fence = Document(page_content="```ini\n[general] suppress = all")
    assert [lead(q) for q in quotes([fence], ["c.md"])] == [""]
    option = Document(
        page_content=":name: Allow the toctree to be referenced\nNumber all headings."
    )
    assert [lead(q) for q in quotes([option], ["c.md"])] == [""]
    # The heading says what the sentence is about; it is not a claim of the answer.
    sources = {"configuration.md#search": [doc.page_content]}
    assert faithful_sentences(shown, sources, quoted=True) == (1, 1)
    # Only in a quote answer: a free answer's bold words are its own claim.
    assert faithful_sentences(shown, sources) == (0, 1)


@pytest.mark.parametrize(
    "reply",
    [
        DONT_KNOW,
        "| Standard | $45.00 | $1,0",  # cut short by max_tokens
        "Something no source says. [handbook.md#benefit-plans]",  # a model off the grammar
        "",
    ],
)
def test_anything_but_an_offered_quote_is_shown_as_written(reply: str) -> None:
    found = quotes([PLANS], ["handbook.md#benefit-plans"])
    assert _shown(found, reply)[0] == reply


def test_quote_answers_of_the_chain_are_shown_formatted_and_cited() -> None:
    model = RecordingModel(responses=["| Standard | $45.00 | $1,000 | [handbook.md#benefit-plans]"])
    chain = create_answer_chain(llm=LLM(model=model, name="tiny", count_tokens=len, grammar=True))
    events = list(
        chain.stream({"question": "What does the standard plan cost?", "documents": [PLANS]})
    )
    out = events[-1]
    answer = "".join(e.get("answer", "") for e in events)
    assert answer.startswith(HEAD) and answer.endswith("\n\n[handbook.md#benefit-plans]")
    assert [c["label"] for c in out["citations"]] == ["handbook.md#benefit-plans"]
    assert not out["abstained"]


def test_the_dont_know_sentence_is_shown_as_written_beside_a_quote_with_a_lead() -> None:
    doc = Document(page_content="## Custom domains\nIt will create the CNAME file for you.")
    found = quotes([doc], ["gh.md#custom-domains"])
    assert lead(found[0]) == "Custom domains"
    writer = QuoteWriter(found, (DONT_KNOW,))
    parts = [writer.add(char) for char in DONT_KNOW] + [writer.close()]
    assert "".join(parts) == DONT_KNOW  # "I" might have begun either: no lead was shown
    chosen = "It will create the CNAME file for you. [gh.md#custom-domains]"
    writer = QuoteWriter(found, (DONT_KNOW,))
    shown = "".join(writer.add(char) for char in chosen) + writer.close()
    assert shown == f"**Custom domains:** {chosen}"


@pytest.mark.parametrize(
    ("heading", "shown"),
    [
        ("Options [advanced]", "**Options advanced:** "),  # a bracket would read as a citation
        ("__init__.py", "**\\_\\_init\\_\\_.py:** "),  # not bold markup: kept, escaped
        ("**dev_addr**", "**dev_addr:** "),
        ("The ` character", "**The \\` character:** "),  # an unmatched backtick, escaped
        ("Use  `**kwargs`   here", "**Use `\\*\\*kwargs` here:** "),
        ("Source file | Generated File | URL", ""),  # a table header read as a heading
    ],
)
def test_a_lead_is_the_heading_as_plain_bold_text(heading: str, shown: str) -> None:
    doc = Document(page_content="Sentences name nothing above them.", metadata={"section": heading})
    writer = QuoteWriter(quotes([doc], ["a.md#x"]))
    assert writer.render("Sentences name nothing above them. [a.md#x]") == (
        f"{shown}Sentences name nothing above them. [a.md#x]"
    )


def test_a_reply_that_strays_from_a_quote_keeps_the_lead_it_was_shown_with() -> None:
    doc = Document(page_content="## Custom domains\nIt will create the CNAME file for you.")
    writer = QuoteWriter(quotes([doc], ["gh.md#x"]), (DONT_KNOW,))
    reply = "It will create X and more."  # a model not held to the grammar
    parts = [writer.add(char) for char in reply] + [writer.close()]
    # "I" may begin the don't-know sentence; "It" no longer: the lead is shown, and stays.
    assert parts[:2] == ["", "**Custom domains:** It"]
    assert "".join(parts) == f"**Custom domains:** {reply}"
