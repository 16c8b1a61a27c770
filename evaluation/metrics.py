"""Evaluation metrics.

Ranking metrics over one query take ``ranked`` ids best first and ``relevant`` id -> grade
(> 0). Text metrics compare a prediction with a reference the way SQuAD does: lowercased,
punctuation and English articles dropped, whitespace collapsed.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence

from ragchains.chains.answer import CITATION_MARKER, LABEL_SEPARATOR

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def ndcg_at_k(ranked: Sequence[str], relevant: Mapping[str, float], k: int) -> float:
    """Normalised discounted cumulative gain with linear gains (as BEIR / pytrec_eval)."""
    dcg = sum(
        relevant.get(doc, 0.0) / math.log2(rank + 1) for rank, doc in enumerate(ranked[:k], start=1)
    )
    ideal = sorted((g for g in relevant.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(rank + 1) for rank, g in enumerate(ideal, start=1))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at_k(ranked: Sequence[str], relevant: Mapping[str, float], k: int) -> float:
    wanted = {doc for doc, grade in relevant.items() if grade > 0}
    if not wanted:
        return 0.0
    return len(wanted & set(ranked[:k])) / len(wanted)


def mrr_at_k(ranked: Sequence[str], relevant: Mapping[str, float], k: int) -> float:
    for rank, doc in enumerate(ranked[:k], start=1):
        if relevant.get(doc, 0.0) > 0:
            return 1.0 / rank
    return 0.0


def normalize_text(text: str) -> str:
    text = _ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION))
    return " ".join(text.split())


def exact_match(prediction: str, reference: str) -> float:
    return float(normalize_text(prediction) == normalize_text(reference))


def token_f1(prediction: str, reference: str, ignore: Collection[str] = ()) -> float:
    """Harmonic mean of token precision and recall (tokens counted with multiplicity).

    Tokens in ``ignore`` (e.g. stop words) are left out of both sides first.
    """
    predicted = [t for t in normalize_text(prediction).split() if t not in ignore]
    wanted = [t for t in normalize_text(reference).split() if t not in ignore]
    if not predicted or not wanted:
        return float(predicted == wanted)
    common = sum((Counter(predicted) & Counter(wanted)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(wanted)
    return 2 * precision * recall / (precision + recall)


def citation_match(cited: Iterable[str], gold: Iterable[str]) -> bool:
    """Every gold citation label is among the cited ones (extra citations are allowed)."""
    return set(gold) <= set(cited)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_END_PUNCTUATION = ".!?;:, "


def cited_sentences(answer: str, *, quoted: bool = False) -> list[tuple[str, list[str]]]:
    """The answer's sentences, each with the labels cited for it.

    The text before a citation marker is cited by it (and by markers that follow with only
    punctuation between: "A [x] [y]." or "A [x; y]"); text after the last marker is cited by
    nothing. Each cited stretch is then cut into sentences at . ! ?. Pieces without a letter
    or digit (the "." after a marker) are not sentences. ``quoted``: a quote answer, whose
    sentences may be shown under a bold heading lead (not part of the sentence).
    """
    claims: list[tuple[str, list[str]]] = []
    position = 0
    for match in CITATION_MARKER.finditer(answer):
        between = answer[position : match.start()]
        labels = [label for label in LABEL_SEPARATOR.split(match.group(1).strip()) if label]
        if claims and not any(c.isalnum() for c in between):
            claims[-1][1].extend(labels)
        else:
            claims.append((between, labels))
        position = match.end()
    claims.append((answer[position:], []))
    return [
        (sentence, labels)
        for text, labels in claims
        for sentence in _statements(text, quoted)
        if any(c.isalnum() for c in sentence)
    ]


# A quoted answer shows a table row under its table's header and rule, and a record as
# "- **field:** value" lines (chains.quote): each row and field stands alone, as written in
# the source ("| Standard | $45.00 |", "price: 45"); the rule line states nothing.
_TABLE_RULE = re.compile(r"^\s*\|?(\s*:?-+:?\s*\|)+\s*(:?-+:?)?\s*$")
_FIELD_ITEM = re.compile(r"^\s*[-*+]\s+\*\*(.+?):\*\*\s*(.*)$")
_ESCAPED = re.compile(r"\\([\\`*_<>\[\]])")
# A quoted sentence may be shown under its section's heading in bold ("**min_search_length:**
# An integer value ..."; chains.quote): the heading says what the sentence is about, it is
# not part of it. A lead ends in : ? ! or . inside the stars.
_LEAD = re.compile(r"^\s*\*\*(?:[^*\\]|\\.)+?[:?!.]\*\*\s+(?=\S)")


def _statements(text: str, quoted: bool = False) -> Iterator[str]:
    """The statements of a cited stretch: table rows and record fields line by line, the
    prose between them cut into sentences."""
    prose: list[str] = []

    def sentences() -> Iterator[str]:
        for sentence in _SENTENCE_END.split(" ".join(" ".join(prose).split())):
            yield sentence.strip().lstrip(_END_PUNCTUATION)
        prose.clear()

    for line in text.splitlines():
        field = _FIELD_ITEM.match(line)
        if _TABLE_RULE.match(line):
            continue
        if line.lstrip().startswith("|") or field:
            yield from sentences()
            row = f"{field[1]}: {field[2]}" if field else line
            yield " ".join(_ESCAPED.sub(r"\1", row).split())
        else:
            prose.append(_LEAD.sub("", line) if quoted else line)
    yield from sentences()


def faithful_sentences(
    answer: str, sources: Mapping[str, Sequence[str]], *, quoted: bool = False
) -> tuple[int, int]:
    """(sentences found verbatim in a source they cite, all sentences) of ``answer``.

    ``sources``: label -> texts of the chunks shown under that label. Matching is exact
    after whitespace is collapsed on both sides; a sentence's closing punctuation may differ
    ("… per month [x]." quotes "… per month, …"). A sentence citing nothing, or only labels
    not among ``sources``, is not found.
    """
    texts = {label: [" ".join(t.split()) for t in found] for label, found in sources.items()}
    sentences = cited_sentences(answer, quoted=quoted)
    found = 0
    for sentence, labels in sentences:
        wanted = sentence.rstrip(_END_PUNCTUATION)
        if any(wanted in text for label in labels for text in texts.get(label, ())):
            found += 1
    return found, len(sentences)
