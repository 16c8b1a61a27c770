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
shows the model the units as it will write them: one ``sentence [label]`` per line.

``QuoteWriter`` turns what the model writes into what the reader sees, as it streams: a
sentence as written; a table row under its table's header row and rule (rows of one table
quoted together share them), the citation on its own line after the table, where it does not
break it; a record (a CSV/JSON/Excel row) as a list of ``**field:** value`` lines, then its
citation; a sentence that names nothing of its section under its heading, in bold before it
(``lead``: "An integer value that defines the minimum length for a search query" says what
it is only under ``min_search_length``). The model copies the units as they are offered;
only the display changes.
"""

import functools
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


# What a unit is, for its display: a sentence (or list item), a table row, a record's fields.
PROSE, ROW, RECORD = "prose", "row", "record"


@dataclass(frozen=True)
class Quote:
    """One quotable unit, the labels of the chunks it is copied from, and its context.

    ``kind``, ``table`` and ``fields`` are how it is shown (``QuoteWriter``): ``table`` is a
    row's table header and rule ("" when its chunk holds no header), ``fields`` a record's
    ``(field, value)`` pairs."""

    text: str
    labels: tuple[str, ...]
    context: str = ""
    kind: str = PROSE
    table: str = ""
    fields: tuple[tuple[str, str], ...] = ()


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
    the table's header row (what a reader needs to see what the unit is about).

    ``kind``: ``prose`` (a sentence, a list item, a piece of a long record), ``row`` (a table
    row; ``table`` holds its table's header row and a compact rule, "" when the chunk holds
    no header) or ``record`` (``fields``: the record's ``(field, value)`` pairs)."""

    text: str
    context: str = ""
    kind: str = PROSE
    table: str = ""
    fields: tuple[tuple[str, str], ...] = ()


def cells(row: str) -> list[str]:
    """A Markdown table row's cells, stripped (``\\|`` is a pipe inside a cell)."""
    inner = row.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") and not inner.endswith("\\|") else inner
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", inner)]


def _compact_rule(rule: str, width: int) -> str:
    """A table's |---| rule with ``width`` columns, each ``---`` keeping its alignment colons
    (a source's rule may be as wide as its widest cell: tokens a reader never sees)."""
    found = cells(rule)
    out = []
    for n in range(width):
        cell = found[n] if n < len(found) else ""
        left, right = cell.startswith(":"), cell.endswith(":") and len(cell) > 1
        out.append(f"{':' if left else ''}---{':' if right else ''}")
    return "| " + " | ".join(out) + " |"


def table_head(header: str, rule: str = "") -> str:
    """A table's header row and a compact rule under it, as two lines."""
    header = _norm(header)
    return f"{header}\n{_compact_rule(rule, len(cells(header)))}"


def _fields(block: str) -> tuple[tuple[str, str], ...]:
    """A record's ``field: value`` lines as pairs (the name never holds a colon)."""
    pairs = []
    for line in block.splitlines():
        name, _, value = line.partition(":")
        pairs.append((name.strip(), _norm(value)))
    return tuple(pairs)


def units_of(text: str, section: str = "") -> list[Unit]:
    """The quotable units of one chunk's text, in order, whitespace collapsed. ``section``
    (the chunk's innermost heading) is the context until a heading in the text; a table's
    header row is the context of its rows, not a unit."""
    units: list[Unit] = []
    heading, header, table, previous = section, "", "", ""
    for kind, block in _blocks(text):
        if kind == "title":
            heading, header, table = block, "", ""
        elif kind == "rule" and previous:
            # The row above a |---| rule is the table's header: context, not an answer.
            header, table = previous, table_head(previous, block)
            if units and units[-1].text == previous:
                units.pop()
        if kind in ("title", "rule"):
            previous = ""
            continue
        if kind != "row":
            header, table = "", ""  # a table ends where other text starts
        previous = _norm(block) if kind == "row" else ""
        whole = kind == "row" or (kind == "record" and len(_norm(block)) <= MAX_QUOTE_CHARS)
        if whole:
            found = [_norm(block)]
        elif kind == "record":  # too long for one quote: its fields' sentences
            found = [s for line in block.splitlines() for s in split_sentences(line)]
        else:
            found = split_sentences(block)
        for sentence in found:
            if sentence.endswith("?"):
                # Not an answer, but what the next sentences answer (a FAQ's question).
                heading, header, table = sentence, "", ""
                continue
            if not any(c.isalnum() for c in sentence):
                continue
            context = " ".join(x for x in (heading, header if kind == "row" else "") if x)
            if kind == "row":
                units.append(Unit(sentence, context, ROW, table))
            elif kind == "record" and whole:
                units.append(Unit(sentence, context, RECORD, fields=_fields(block)))
            else:
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
    order (the compressor's: a reranker's best first, else the retrieved order).
    """
    found: dict[str, tuple[list[str], Unit]] = {}
    # Table heads by label and width: a chunk that starts inside a table (the overlap of the
    # chunk before) holds rows without their header; a chunk of the same section that holds
    # the header lends it.
    heads: dict[tuple[str, int], str] = {}
    for doc, label in zip(documents, labels, strict=True):
        for unit in units_of(doc.page_content, _section(doc)):
            owners, first = found.setdefault(unit.text, ([], unit))
            if label not in owners:
                owners.append(label)
            if unit.table and not first.table:
                found[unit.text] = (owners, unit)  # the same row, seen with its header
            if unit.table:
                heads.setdefault((label, len(cells(unit.text))), unit.table)
    listed = []
    for text, (owners, unit) in found.items():
        table = unit.table
        if unit.kind == ROW and not table:
            width = len(cells(text))
            table = next((heads[(o, width)] for o in owners if (o, width) in heads), "")
        listed.append(Quote(text, tuple(owners), unit.context, unit.kind, table, unit.fields))
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


# Characters that would turn a record's value into Markdown (emphasis, code, HTML, links).
_MARKDOWN = re.compile(r"([\\`*_<>\[\]])")


def _escaped(value: str) -> str:
    return _MARKDOWN.sub(r"\\\1", value)


def _head_of(quote: Quote) -> str:
    """A row's table head: its table's, else an empty header row as wide as the row (a
    GFM table must have one; empty cells say "unknown" where invented names would lie)."""
    if quote.table:
        return quote.table
    width = len(cells(quote.text))
    return table_head("|" + " |" * width)


@dataclass(frozen=True)
class _Choice:
    """One quote as the model writes it: ``text [label]``."""

    quote: Quote
    label: str

    @property
    def text(self) -> str:
        return f"{self.quote.text} [{self.label}]"


def _marker(labels: Sequence[str]) -> str:
    return "[" + "; ".join(dict.fromkeys(labels)) + "]"


def _group(written: Sequence[_Choice]) -> list[list[_Choice]]:
    """Consecutive quotes as shown together: rows of one table share its head; any other
    quote stands alone."""
    groups: list[list[_Choice]] = []
    for item in written:
        last = groups[-1][-1].quote if groups else None
        if (
            last is not None
            and item.quote.kind == ROW
            and last.kind == ROW
            and _head_of(last) == _head_of(item.quote)
        ):
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


# What would end the bold or read as HTML in a lead is escaped; brackets are dropped (a
# "[label]" is a citation marker, escaped or not, to the parsers of answers).
_LEAD_MARKUP = re.compile(r"([\\*<>])")
_EDGE_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_WRAPPED = re.compile(r"^(\*\*|__)(.+)\1$")  # a line bolded as a heading
_FENCE = ("```", "~~~")


# Asked for every quote the reply may still become, at every token it streams: once each.
@functools.lru_cache(maxsize=1024)
def lead(quote: Quote) -> str:
    """The heading a prose quote is shown under: its section's, when the quote holds none
    of the heading's terms (it says what the quote is about); "" otherwise. A heading
    bolded whole loses its stars (a page may bold a line as its heading); a code fence, a
    table row or a directive's option line (":name: x") read as a heading is none."""
    if quote.kind != PROSE or not quote.context:
        return ""
    heading = " ".join(quote.context.split())
    heading = _WRAPPED.sub(r"\2", heading).strip()
    if (
        not heading
        or heading.startswith(_FENCE)
        or "|" in heading
        or not (heading[0].isalnum() or heading[0] in "_`'\"([")
    ):
        return ""
    terms = set(tokenize(heading)) - _ASKING
    return heading if terms and not terms & set(tokenize(quote.text)) else ""


def _with_lead(quote: Quote, text: str) -> str:
    heading = lead(quote)
    if not heading:
        return text
    colon = "" if heading.endswith((":", "?", "!", ".")) else ":"
    # A heading's identifiers (min_search_length) and code spans stay as the page writes
    # them; an unmatched backtick would open a code span over the rest of the answer.
    shown = _LEAD_MARKUP.sub(r"\\\1", heading.replace("[", "").replace("]", ""))
    shown = _EDGE_UNDERSCORE.sub(r"\\_", shown)  # "__init__" would read as bold "init"
    if shown.count("`") % 2:
        shown = shown.replace("`", "\\`")
    return f"**{shown}{colon}** {text}"


def _show(group: Sequence[_Choice], closed: bool) -> str:
    """A group as the reader sees it. A table: head, rows, then (once no further row of it
    can follow: ``closed``) its citation after a blank line, outside the table (GFM reads a
    line right under a table as one more row). A record: ``- **field:** value`` lines, then
    its citation. Anything else: the quote as written, under its ``lead`` if it has one."""
    first = group[0].quote
    labels = [item.label for item in group]
    if first.kind == ROW:
        table = "\n".join([_head_of(first), *(item.quote.text for item in group)])
        return f"{table}\n\n{_marker(labels)}" if closed else table
    if first.kind == RECORD and first.fields:
        lines = "\n".join(f"- **{name}:** {_escaped(value)}" for name, value in first.fields)
        return f"{lines}\n\n{_marker(labels)}"
    return _with_lead(first, group[0].text)


def _between(before: Sequence[_Choice] | None, after_block: bool) -> str:
    """What separates a group from the one before: a blank between prose quotes, a blank line
    where a table or list starts or ends."""
    if before is None:
        return ""
    return "\n\n" if after_block or _apart(before[0].quote) else " "


def _block(quote: Quote) -> bool:
    return quote.kind == ROW or (quote.kind == RECORD and bool(quote.fields))


def _apart(quote: Quote) -> bool:
    """Whether ``quote`` stands in a paragraph of its own: a block, or a sentence under its
    lead."""
    return _block(quote) or bool(lead(quote))


def _shared_start(a: str, b: str) -> int:
    """How many characters ``a`` and ``b`` begin with alike."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class QuoteWriter:
    """The answer a reader sees, from the quote answer the model writes, as it streams.

    The model writes ``unit [label]`` quotes joined by a blank (``quote_grammar``). Sentences
    are shown as written, token by token; a table row or a record is shown once written
    whole, formatted (``_show``); a table's citation once no further row of it can follow.
    Text that is no offered quote (the don't-know sentence, a reply cut short, a model not
    held to the grammar) is shown as written. ``add`` returns the new part of the answer
    shown; ``close`` the rest at the end. The parts add up to ``render`` of the whole reply.
    """

    def __init__(self, offered: Sequence[Quote], others: Sequence[str] = ()) -> None:
        self.choices = [_Choice(q, label) for q in offered for label in q.labels]
        # What the model may write instead of a quote (the don't-know sentence): a lead is
        # shown only once the reply cannot be one of these.
        self.others = tuple(others)
        self.written = ""
        self.shown = ""

    def add(self, piece: str) -> str:
        self.written += piece
        return self._advance(final=False)

    def close(self) -> str:
        return self._advance(final=True)

    def _advance(self, *, final: bool) -> str:
        now = self.render(self.written, final=final)
        if not now.startswith(self.shown):  # cannot happen: shown parts are never redone
            now = self.shown + now[len(self.shown) :]
        new, self.shown = now[len(self.shown) :], now
        return new

    def _parse(self, reply: str) -> tuple[list[_Choice], str]:
        """The whole quotes at the start of ``reply`` and what follows them."""
        done: list[_Choice] = []
        rest = reply.lstrip()
        while rest:
            body = rest[1:] if done and rest.startswith(" ") else rest
            hits = [c for c in self.choices if body.startswith(c.text)]
            if not hits:
                break
            hit = max(hits, key=lambda c: len(c.text))
            done.append(hit)
            rest = body[len(hit.text) :]
        return done, rest

    def _tail(self, tail: str, possible: Sequence[_Choice], final: bool) -> tuple[str, bool]:
        """What is shown of the reply's unfinished end, and whether it stands apart (under
        a lead). A sentence streams as written once its lead is known: when every quote it
        may still become has the same one (most often, none) and it may no longer be one of
        ``others``. An end that strayed from every quote (a model off the grammar, a reply
        cut short) keeps the lead of the quotes it began as, so what was shown stays."""
        if not tail:
            return "", False
        if any(_block(c.quote) for c in possible):
            return (tail, False) if final else ("", False)  # shown once written whole
        other = any(o.startswith(tail) for o in self.others)
        if not possible and other:
            return tail, False  # the don't-know sentence, as written
        began = list(possible) or self._began(tail)
        leads = {lead(c.quote) for c in began}
        if other:
            leads.add("")  # it may yet be the don't-know sentence, which has no lead
        if not began or leads == {""}:
            return tail, False
        if len(leads) == 1:
            return _with_lead(began[0].quote, tail), True
        return (tail, False) if final else ("", False)

    def _began(self, tail: str) -> list[_Choice]:
        """The quotes that share the longest beginning with ``tail`` (none if no quote
        starts with its first character)."""
        shared = max((_shared_start(c.text, tail) for c in self.choices), default=0)
        return [c for c in self.choices if shared and c.text[:shared] == tail[:shared]]

    def render(self, reply: str, *, final: bool = True) -> str:
        """``reply`` (all the model wrote, or so far) as shown: with ``final`` False, only what
        will not change whatever the model writes next."""
        done, rest = self._parse(reply)
        tail = rest[1:] if done and rest.startswith(" ") else rest
        possible = [c for c in self.choices if c.text.startswith(tail)] if tail else []
        shown_tail, tail_apart = self._tail(tail, possible, final)
        groups = _group(done)
        parts: list[str] = []
        before: list[_Choice] | None = None
        for n, group in enumerate(groups):
            head = _head_of(group[0].quote) if group[0].quote.kind == ROW else None
            closed = (
                n < len(groups) - 1
                or final
                or (
                    bool(tail)
                    and not any(c.quote.kind == ROW and _head_of(c.quote) == head for c in possible)
                )
            )
            parts.append(_between(before, _apart(group[0].quote)) + _show(group, closed))
            if not closed:
                return "".join(parts)  # what follows an open table is not known yet
            before = group
        if shown_tail:
            parts.append(_between(before, tail_apart) + shown_tail)
        return "".join(parts)


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
