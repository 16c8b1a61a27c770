"""The quote answer style: sentences copied verbatim from the kept chunks, each with its label.

``quotes`` splits each chunk into the units a reader would quote: prose sentences (lines a
PDF or Markdown file wraps are joined first), list items, table rows and the records of
CSV/JSON rows (``field: value`` lines). Headings, a table's header row and rule, and
questions are left out: they are never the answer (headings and headers are kept as the
units' context). A unit longer than ``MAX_QUOTE_CHARS`` is cut at clause or word boundaries,
so every unit stays a verbatim stretch of its chunk (whitespace collapsed).

``shortlist`` keeps the few units that share most of the question's words: a 135M model
offered every sentence copies whichever starts the way its own answer would ("The ..."),
so the shortlist finds and the model chooses among the few, or declines.

``quote_grammar`` turns the units into GBNF for llama.cpp: the answer is one to ``sentences``
units, each followed by `` [label]`` of a chunk it comes from, or exactly the don't-know
sentence. Decoding under it cannot write a word the sources do not hold. ``format_quotes``
shows the model the units as the answer will look: one ``sentence [label]`` per line.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from langchain_core.documents import Document

from ragchains.retrievers.bm25 import tokenize

MAX_QUOTE_CHARS = 300
# The model chooses among the few units that share most of the question's words (a 135M model
# offered every sentence copies the one that starts like its own answer would, "The ...").
QUOTE_CANDIDATES = 3
QUOTE_WITHIN = 0.7  # of the best unit's score
QUOTE_SENTENCES = 2  # at most this many quotes per answer
# Short lines without an ending, followed by a capitalised one, are headings (PDF titles,
# "3. Meals and per diem"), not the start of a wrapped sentence.
_HEADING_WORDS = 8

_MD_HEADING = re.compile(r"^\s{0,3}#{1,6}\s")
_TABLE_RULE = re.compile(r"^\s*\|?(\s*:?-{2,}:?\s*\|)+\s*:?-*:?\s*$")
_TABLE_ROW = re.compile(r"^\s*\|.*\|\s*$")
# Bullets, "3." / "3)" / "(3)", "a)" / "(a)"; not "J." (an initial starts a sentence).
_LIST_ITEM = re.compile(r"^\s*(?:[-*+•‣◦]|\(?\d{1,3}[.)]|\(?[a-z]\)|\([A-Za-z]\))\s+(?=\S)")
# "price: 34.0": a field of a CSV or JSON row as ingest writes it (a name of up to 3 words).
_FIELD = re.compile(r"^([A-Za-z_][\w()/-]*(?: [\w()/-]+){0,2})\s*:\s+\S")
_ENDS = re.compile(r"[.!?:;,…)\]\"'”’]$")
# A sentence ends at . ! ? (maybe closed by a quote or bracket) before a blank and a
# character that is not a lowercase letter.
_BOUNDARY = re.compile(r"(?<=[.!?])[\"'”’)\]]*\s+(?=[^\sa-z])")
# fmt: off
_ABBREVIATIONS = frozenset((
    "e.g", "i.e", "etc", "vs", "cf", "al", "approx", "fig", "no", "nos", "st", "mr", "mrs",
    "ms", "dr", "prof", "inc", "ltd", "co", "corp", "jr", "sr", "dept", "ca",
    "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
))
# fmt: on
_CLAUSE = re.compile(r"(?<=[;,:])\s+")
_SENTENCE_END = re.compile(r"[.!?:][\"'”’)\]]*$")


@dataclass(frozen=True)
class Quote:
    """One quotable unit, the labels of the chunks it is copied from, and its context."""

    text: str
    labels: tuple[str, ...]
    context: str = ""


def _norm(text: str) -> str:
    return " ".join(text.split())


def _is_heading_line(line: str, following: str | None) -> bool:
    """A short line with no ending punctuation before a line that does not continue it."""
    words = line.split()
    return (
        following is not None
        and 0 < len(words) <= _HEADING_WORDS
        and not _ENDS.search(line)
        and not following[:1].islower()
    )


def _blocks(text: str) -> Iterator[tuple[str, str]]:
    """The chunk's structural blocks as (kind, text): ``prose`` (wrapped lines joined),
    ``item`` (a list item with its continuation lines), ``row`` (a table row), ``record``
    (consecutive ``field: value`` lines; a repeated field starts a new record), ``title`` (a
    heading) and ``rule`` (a table's header rule); titles and rules are not quoted."""
    lines = [line.strip() for line in text.splitlines()]
    # The next non-blank line after each line (None after the last).
    after: list[str | None] = []
    upcoming: str | None = None
    for line in reversed(lines):
        after.append(upcoming)
        upcoming = line or upcoming
    after.reverse()
    kind, parts, fields = "", list[str](), set[str]()

    def flush() -> Iterator[tuple[str, str]]:
        if len(parts) > 1 and kind == "record":
            yield kind, "\n".join(parts)
        elif parts:  # one "name: value" line is prose
            yield ("prose" if kind == "record" else kind), " ".join(parts)
        parts.clear()
        fields.clear()

    for line, following in zip(lines, after, strict=True):
        if not line:
            yield from flush()
        elif _TABLE_RULE.match(line):
            yield from flush()
            yield "rule", line
        elif _MD_HEADING.match(line):
            yield from flush()
            yield "title", line.lstrip("#").strip()
        elif _TABLE_ROW.match(line):
            yield from flush()
            yield "row", line
        elif item := _LIST_ITEM.match(line):
            yield from flush()
            body = line[item.end() :]
            if _is_heading_line(body, following):
                yield "title", body
            else:
                kind = "item"
                parts.append(body)
        elif (field := _FIELD.match(line)) and (kind == "record" or not parts):
            name = field.group(1).lower()
            if name in fields:
                yield from flush()
            kind = "record"
            fields.add(name)
            parts.append(line)
        else:
            if kind == "record" and len(parts) == 1:
                kind = "prose"  # "Note: ..." and the lines it wraps onto
            elif kind == "record":
                yield from flush()
            if _is_heading_line(line, following) and (not parts or _SENTENCE_END.search(parts[-1])):
                yield from flush()
                yield "title", line
                continue
            if not parts:
                kind = "prose"
            parts.append(line)
    yield from flush()


def _abbreviation(word: str) -> bool:
    """``word`` (the last before a period) is an abbreviation or an initial: "e.g.",
    "U.S.", "Dr.", "J."."""
    bare = word.rstrip(".").lower()
    if bare in _ABBREVIATIONS or (len(bare) == 1 and bare.isalpha()):
        return True
    pieces = bare.split(".")
    return len(pieces) > 1 and all(0 < len(p) <= 2 and p.isalpha() for p in pieces)


def split_sentences(text: str) -> list[str]:
    """Prose cut into sentences at . ! ? before a blank and a character that is not a
    lowercase letter; abbreviations, initials and a leading list number do not end one."""
    text = _norm(text)
    sentences: list[str] = []
    start = 0
    for match in _BOUNDARY.finditer(text):
        before = text[start : match.start()]
        word = before.rsplit(" ", 1)[-1]
        if word.endswith(".") and (_abbreviation(word) or before.rstrip(".").isdigit()):
            continue
        sentences.append(text[start : match.end()].strip())
        start = match.end()
    sentences.append(text[start:].strip())
    return [s for s in sentences if s]


def _cut(text: str, limit: int = MAX_QUOTE_CHARS) -> list[str]:
    """``text`` in pieces of at most ``limit`` characters, cut after ; , : where possible,
    else between words (a single longer word is cut where it must)."""
    if len(text) <= limit:
        return [text]
    pieces: list[str] = []
    current = ""
    for clause in _CLAUSE.split(text):
        for word in clause.split(" ") if len(clause) > limit else [clause]:
            while len(word) > limit:
                if current:
                    pieces.append(current)
                    current = ""
                pieces.append(word[:limit])
                word = word[limit:]
            joined = f"{current} {word}" if current else word
            if len(joined) <= limit:
                current = joined
            else:
                pieces.append(current)
                current = word
    if current:
        pieces.append(current)
    return pieces


@dataclass(frozen=True)
class Unit:
    """A quotable unit of a chunk and its context: the heading above it, and for a table row
    the table's header row (what a reader needs to see what the unit is about)."""

    text: str
    context: str = ""


def units_of(text: str, section: str = "") -> list[Unit]:
    """The quotable units of one chunk's text, in order, whitespace collapsed. ``section``
    (the chunk's innermost heading) is the context until a heading in the text; a table's
    header row is the context of its rows, not a unit."""
    units: list[Unit] = []
    heading, header, previous = section, "", ""
    for kind, block in _blocks(text):
        if kind == "title":
            heading, header = block, ""
        elif kind == "rule" and previous:
            # The row above a |---| rule is the table's header: context, not an answer.
            header = previous
            if units and units[-1].text == previous:
                units.pop()
        if kind in ("title", "rule"):
            previous = ""
            continue
        previous = _norm(block) if kind == "row" else ""
        if kind == "row" or (kind == "record" and len(_norm(block)) <= MAX_QUOTE_CHARS):
            found = [_norm(block)]
        elif kind == "record":  # too long for one quote: its fields' sentences
            found = [s for line in block.splitlines() for s in split_sentences(line)]
        else:
            found = split_sentences(block)
        for sentence in found:
            if sentence.endswith("?"):
                # Not an answer, but what the next sentences answer (a FAQ's question).
                heading, header = sentence, ""
                continue
            if not any(c.isalnum() for c in sentence):
                continue
            context = " ".join(x for x in (heading, header if kind == "row" else "") if x)
            units.extend(Unit(piece, context) for piece in _cut(sentence))
    return units


def sentences_of(text: str) -> list[str]:
    """The quotable units of one chunk's text, in order, whitespace collapsed."""
    return [unit.text for unit in units_of(text)]


def _section(doc: Document) -> str:
    """The innermost heading of the chunk's section path ("Handbook > Paid time off")."""
    return str(doc.metadata.get("section") or "").rsplit(">", 1)[-1].strip()


def quotes(
    documents: Sequence[Document], labels: Sequence[str], question: str | None = None
) -> list[Quote]:
    """Every chunk's units, each once, with the labels of all chunks that hold it.

    Without a question, in the order the chunks are given. With one, ranked by the
    question's words each holds (``rank``), most relevant first; ties keep the chunks'
    order (the compressor's, best first).
    """
    found: dict[str, tuple[list[str], str]] = {}
    for doc, label in zip(documents, labels, strict=True):
        for unit in units_of(doc.page_content, _section(doc)):
            owners, _ = found.setdefault(unit.text, ([], unit.context))
            if label not in owners:
                owners.append(label)
    listed = [Quote(text, tuple(owners), context) for text, (owners, context) in found.items()]
    return rank(listed, question) if question else listed


# Words that ask rather than say what is asked about (BM25's stop words keep some of them).
_ASKING = frozenset(
    tokenize(
        "what which who whom whose when where why how does do did is are was were be been can "
        "could should would will shall may might must have has had many much tell give show "
        "list find please kind sort type"
    )
)


def scores(found: Sequence[Quote], question: str) -> list[float]:
    """Each unit's relevance to ``question``: the IDF weights (over these units) of the
    question's terms it holds, those only in its context (heading, table header) at half
    weight. Terms as BM25 sees them (stemmed, no stop words), without the asking words
    ("what", "how many", "does")."""
    wanted = set(tokenize(question)) - _ASKING
    own = [set(tokenize(q.text)) & wanted for q in found]
    around = [set(tokenize(q.context)) & wanted - o for q, o in zip(found, own, strict=True)]
    df = Counter(t for o, a in zip(own, around, strict=True) for t in o | a)
    idf = {t: math.log(1 + len(found) / n) for t, n in df.items()}
    return [
        sum(idf[t] for t in o) + 0.5 * sum(idf[t] for t in a)
        for o, a in zip(own, around, strict=True)
    ]


def rank(found: Sequence[Quote], question: str) -> list[Quote]:
    """``found`` ordered by ``scores``, most relevant first; ties keep their order."""
    score = scores(found, question)
    return [found[n] for n in sorted(range(len(found)), key=lambda n: -score[n])]


def shortlist(
    found: Sequence[Quote],
    question: str,
    *,
    limit: int = QUOTE_CANDIDATES,
    within: float = QUOTE_WITHIN,
) -> list[Quote]:
    """The units worth offering the model: at most ``limit``, best first, each scoring at
    least ``within`` of the best score (all tie at 0 when no unit shares a word with the
    question: then the first ``limit`` in the chunks' order)."""
    score = scores(found, question)
    order = sorted(range(len(found)), key=lambda n: -score[n])
    best = score[order[0]] if order else 0.0
    return [found[n] for n in order[:limit] if score[n] >= within * best]


def format_quotes(found: Sequence[Quote]) -> str:
    """The sources block of the quote prompt: one ``unit [label]`` line per quote, in the
    order given."""
    return "\n".join(f"{q.text} [{q.labels[0]}]" for q in found)


def gbnf_literal(text: str) -> str:
    """``text`` as a GBNF string literal, in ASCII: quotes, backslashes and control
    characters escaped, anything beyond ASCII as ``\\uXXXX`` / ``\\UXXXXXXXX`` (llama.cpp
    reads those as code points; JSON's surrogate pairs it would not)."""
    out = ['"']
    for char in text:
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif char == "\r":
            out.append("\\r")
        elif char == "\t":
            out.append("\\t")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02X}")
        elif code < 0x80:
            out.append(char)
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04X}")
        else:
            out.append(f"\\U{code:08X}")
    out.append('"')
    return "".join(out)


def quote_grammar(found: Sequence[Quote], dont_know: str, *, sentences: int = 1) -> str:
    """GBNF: exactly ``dont_know``, or 1..``sentences`` different quotes ``<unit> [<label>]``
    joined by a blank, each unit with a label of a chunk that holds it.

    No quote twice (a small model repeats itself): after each quote, a rule offering the
    ones not used yet (``r`` offers all, ``r0`` all but q0, ``r0-2`` all but q0 and q2).
    """
    if sentences < 1:
        raise ValueError("sentences must be at least 1")
    if not found:
        return f"root ::= {gbnf_literal(dont_know)}\n"
    label_rule: dict[str, str] = {}
    quote_rules = []
    for n, quote in enumerate(found):
        refs = []
        for label in quote.labels:
            if label not in label_rule:
                label_rule[label] = f"l{len(label_rule)}"
            refs.append(label_rule[label])
        cited = refs[0] if len(refs) == 1 else "(" + " | ".join(refs) + ")"
        quote_rules.append(f"q{n} ::= {gbnf_literal(quote.text)} {cited}")
    choice_rules: dict[str, str] = {}

    def choice(used: tuple[int, ...]) -> str:
        name = "r" + "-".join(map(str, used))
        if name not in choice_rules:
            choice_rules[name] = ""  # reserved: the order rules are written in
            options = []
            for n in range(len(found)):
                if n in used:
                    continue
                after = tuple(sorted((*used, n)))
                more = len(after) < min(sentences, len(found))
                options.append(f'q{n} (" " {choice(after)})?' if more else f"q{n}")
            choice_rules[name] = f"{name} ::= " + " | ".join(options)
        return name

    head = [f"root ::= dontknow | {choice(())}", f"dontknow ::= {gbnf_literal(dont_know)}"]
    labels = [f"{rule} ::= {gbnf_literal(f' [{label}]')}" for label, rule in label_rule.items()]
    return "\n".join([*head, *choice_rules.values(), *quote_rules, *labels]) + "\n"
