"""Filters the conversation supports, and numeric ranges read from the question itself.

A small model proposes filters the user never asked for ("which sensors cost less than 50
dollars?" → ``price <= 1``); one such filter empties the search and the turn abstains. So a
filter from the model is kept only when it is grounded: each of its values appears in what the
user wrote (a number as a number, with currency signs and thousands separators understood; a
string by its words). The field itself was already checked against the index's fields.

For the fields a domain marks as ranges (``range_fields`` in ``domain.yaml``: field → the
words that point at it, e.g. price → cost, dollars, $), the common phrasings are read without
a model: "under / below / less than / cheaper than N", "over / above / more than N",
"between A and B", "at most / at least / up to N". What they give replaces the model's filters
on that field, since a rule that matched the user's words is surer than the model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from langchain_core.messages import BaseMessage

from ragchains.retrievers.filters import MetadataFilter

# A number as people write it: "$1,299.99", "50", "€20", "2.5k", "1 000" is two numbers.
_NUMBER = (
    r"(?P<{cur}>[$€£]\s?)?(?P<{num}>\d{{1,3}}(?:,\d{{3}})+(?:\.\d+)?|\d+(?:\.\d+)?)(?P<{k}>k\b)?"
)
_ANY_NUMBER = re.compile(r"(?<![\w.])" + _NUMBER.format(cur="cur", num="num", k="k"), re.I)
_WORD = re.compile(r"[^\W_]+")
_GLOB = re.compile(r"[*?\[\]]+")
# Words that end the clause a comparison belongs to.
_CLAUSE_END = re.compile(r"[.;:!?\n]|\b(?:and|or|but|with|which|that)\b(?!\s+\d)", re.I)
# How far (in characters) from the comparison a field's cue word may stand.
_CUE_REACH = 40

_A = _NUMBER.format(cur="cur", num="num", k="k")
_B = _NUMBER.format(cur="cur2", num="num2", k="k2")
_PHRASES: tuple[tuple[re.Pattern[str], str, str | None], ...] = tuple(
    (re.compile(r"\b" + words + r"\s+" + number, re.I), low, high)
    for words, number, low, high in (
        (r"between", _A + r"\s*(?:and|to|-)\s*" + _B, ">=", "<="),
        (r"(?:at most|no more than|not more than|up to|maximum of|max(?:imum)?)", _A, "<=", None),
        (r"(?:at least|no less than|not less than|minimum of|min(?:imum)?)", _A, ">=", None),
        (
            r"(?:under|below|less than|cheaper than|lower than|fewer than|beneath)",
            _A,
            "<",
            None,
        ),
        (
            r"(?:over|above|more than|greater than|higher than|pricier than|"
            r"more expensive than|exceeding)",
            _A,
            ">",
            None,
        ),
    )
)


def user_text(question: str, history: Sequence[BaseMessage] = ()) -> str:
    """What the user wrote in this conversation: the question and their earlier messages."""
    said = [str(m.content) for m in history if m.type == "human"]
    return "\n".join([*said, question])


def _to_number(number: str, thousands: str | None) -> float:
    value = float(number.replace(",", ""))
    return value * 1000 if thousands else value


def numbers_in(text: str) -> set[float]:
    """Every number in ``text``; "2.5k" counts as 2.5 and as 2500."""
    found: set[float] = set()
    for match in _ANY_NUMBER.finditer(text):
        found.add(_to_number(match["num"], None))
        if match["k"]:
            found.add(_to_number(match["num"], match["k"]))
    return found


def _words(text: str) -> set[str]:
    return {w.casefold() for w in _WORD.findall(text)}


def is_grounded(flt: MetadataFilter, text: str) -> bool:
    """Each value of ``flt`` appears in ``text``: a number among its numbers, a string by all
    its words (glob characters aside), a boolean by the field's own words ("in stock")."""
    values = flt.value if isinstance(flt.value, list) else [flt.value]
    numbers, words = numbers_in(text), _words(text)
    for value in values:
        if isinstance(value, bool):
            wanted = _words(flt.field.replace("_", " "))
        elif isinstance(value, int | float):
            if float(value) not in numbers:
                return False
            continue
        else:
            wanted = _words(_GLOB.sub(" ", value))
        if not wanted or not wanted <= words:
            return False
    return True


@dataclass
class Grounded:
    """The filters kept, and a note for each one dropped or read from the question."""

    filters: list[MetadataFilter] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _field_for(
    text: str, start: int, end: int, currency: bool, range_fields: Mapping[str, Iterable[str]]
) -> str | None:
    """The range field a comparison at ``text[start:end]`` is about: the one with a cue word
    in its clause (nearest first), or the only one that takes currency when a currency sign
    is on the number. None when nothing points at one."""
    left = max([0, *(m.end() for m in _CLAUSE_END.finditer(text, 0, start))])
    after = _CLAUSE_END.search(text, end)
    right = after.start() if after else len(text)
    left, right = max(left, start - _CUE_REACH), min(right, end + _CUE_REACH)
    clause = text[left:right].casefold()
    best: tuple[int, str] | None = None
    for name, cues in range_fields.items():
        for cue in [name.replace("_", " "), *cues]:
            cue = cue.casefold()
            pattern = re.escape(cue) if not cue.isalnum() else r"\b" + re.escape(cue) + r"\w*"
            for hit in re.finditer(pattern, clause):
                distance = min(abs(left + hit.start() - start), abs(left + hit.start() - end))
                if best is None or distance < best[0]:
                    best = (distance, name)
    if best is not None:
        return best[1]
    if currency:
        money = [n for n, cues in range_fields.items() if {"$", "€", "£"} & set(cues)]
        if len(money) == 1:
            return money[0]
    return None


def extract_ranges(
    question: str, range_fields: Mapping[str, Iterable[str]]
) -> list[MetadataFilter]:
    """Numeric ranges the question states for the given fields, by the common phrasings."""
    found: list[MetadataFilter] = []
    taken: list[tuple[int, int]] = []
    for pattern, low_op, high_op in _PHRASES:
        for match in pattern.finditer(question):
            if any(s < match.end() and match.start() < e for s, e in taken):
                continue  # "between" already read these numbers
            currency = bool(match["cur"] or (high_op and match["cur2"]))
            name = _field_for(question, match.start(), match.end(), currency, range_fields)
            if name is None:
                continue
            taken.append((match.start(), match.end()))
            first = _to_number(match["num"], match["k"])
            found.append(_range(name, low_op, first))
            if high_op:
                found.append(_range(name, high_op, _to_number(match["num2"], match["k2"])))
    return found


def _range(name: str, op: str, value: float) -> MetadataFilter:
    plain = int(value) if value.is_integer() else value
    return MetadataFilter.model_validate({"field": name, "op": op, "value": plain})


def ground_filters(
    filters: Sequence[MetadataFilter],
    *,
    question: str,
    history: Sequence[BaseMessage] = (),
    range_fields: Mapping[str, Iterable[str]] | None = None,
    fields: Mapping[str, str] | None = None,
) -> Grounded:
    """The model's ``filters`` that the conversation supports, with the question's own ranges
    on the domain's range fields (those the index has as numbers) in place of the model's."""
    said = user_text(question, history)
    fields = fields or {}
    numeric = {n: cues for n, cues in (range_fields or {}).items() if fields.get(n) == "number"}
    ranges = extract_ranges(question, numeric)
    ranged = {f.field for f in ranges}
    out = Grounded()
    for flt in filters:
        if flt.field in ranged:
            if flt in ranges:
                out.filters.append(flt)
            else:
                out.notes.append(f"replaced filter {flt}: the question states the range")
        elif is_grounded(flt, said):
            out.filters.append(flt)
        else:
            out.notes.append(f"dropped filter {flt}: its value is not in what you wrote")
    for flt in ranges:
        if flt not in out.filters:
            out.filters.append(flt)
            out.notes.append(f"filter {flt} read from the question")
    return out
