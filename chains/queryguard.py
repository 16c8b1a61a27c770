"""What a query the chain searches may hold: the user's question words, and nothing the
conversation never said.

Every query a chat turn searches besides the user's own words is written by the chat model:
the rewrite, each multi-query phrasing, a re-query. A small model invents: a price the
sources never gave ("10.5 cents"), an institute in Berlin, an earlier unrelated question
glued to this one, the words of the prompt's own example. Searched, such a query finds
passages about what it invented, and a kept re-query hands them to the answer. ``QueryGuard``
holds each query to one rule before it is searched: it keeps at least ``REWRITE_KEEPS`` of
the question's content words, and brings in no number, name or statement that is in neither
the question nor the history. A refused query is not searched; the turn says why.
"""

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from langchain_core.messages import BaseMessage

from ragchains.chains.toolcalls import text_calls
from ragchains.retrievers.bm25 import ASKING, tokenize

# A query that keeps less of the question's content words than this is not searched.
REWRITE_KEEPS = 0.5
# A query longer than this (or twice the question) reads like an answer, not a search.
MAX_QUERY_WORDS = 16

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_WORD = re.compile(r"[^\W\d_][\w'’&-]*")
# Where a sentence starts: its first word is capitalised whatever it is.
_SENTENCE_END = re.compile(r"[.?!:;]\s+|\n")
_ENDS = re.compile(r"[.?!](?=\s|$)")
# The arguments of the example calls that hold words of a query.
_QUERY_ARGUMENTS = frozenset({"search_query", "filename"})
# Words that make a statement of a query ("the cost is 10.5 cents", "VACL is: ...").
_STATING = frozenset({"is", "are", "was", "were", "equals", "means", "costs"})
_QUESTION_WORDS = frozenset(
    re.findall(
        r"\w+",
        "what which who whom whose when where why how is are was were do does did can could "
        "should would will may",
    )
)


def _number(text: str) -> str:
    return text.replace(",", "")


def _bare(word: str) -> str:
    """A word without a possessive ending, lower-cased: "Jared's" -> "jared"."""
    return re.sub(r"['’]s?$", "", word).casefold()


def names(query: str) -> list[str]:
    """Words of ``query`` that look like names: an acronym or a CamelCase word anywhere
    ("NICESS", "LoRa"), or a capitalised word that does not start a sentence ("Berlin")."""
    found = []
    for sentence in _SENTENCE_END.split(query):
        words = _WORD.findall(sentence)
        for at, word in enumerate(words):
            if re.split(r"['’]", word)[0] == "I":
                continue  # "I", "I'm": the pronoun, capitalised everywhere
            letters = [c for c in word if c.isalpha()]
            upper = sum(c.isupper() for c in letters)
            if upper >= 2 or (upper == 1 and word[0].isupper() and at > 0):
                found.append(word)
    return found


def _example_queries(example: str) -> list[str]:
    """The queries a few-shot reply writes: its calls' arguments, or the reply itself."""
    calls = [c.get("args") or {} for c in text_calls(example)]
    if not calls:
        return [example]
    return [str(v) for args in calls for k, v in args.items() if k in _QUERY_ARGUMENTS]


@dataclass(frozen=True)
class QueryGuard:
    """The rule every model-written query of one turn is held to (``refusal``)."""

    question: str
    # What the conversation said: lower-cased words, stemmed tokens and numbers.
    words: frozenset[str]
    tokens: frozenset[str]
    numbers: frozenset[str]
    # The question's content words a query must keep (``REWRITE_KEEPS`` of them).
    wanted: frozenset[str]
    # The words of the prompt examples' queries that the conversation never used.
    example_words: frozenset[str]

    @classmethod
    def for_turn(
        cls,
        question: str,
        history: Sequence[BaseMessage] = (),
        *,
        also_said: Iterable[str] = (),
        carried: Iterable[str] = (),
        examples: Iterable[str] = (),
    ) -> "QueryGuard":
        """``also_said``: text that counts as said (the domain's glossary). ``carried``:
        words a filter carries, which a query need not repeat. ``examples``: the few-shot
        replies of the prompt that wrote the queries."""
        said = " ".join([question, *(str(m.content) for m in history), *also_said])
        tokens = frozenset(tokenize(said))
        kept = {t for t in tokenize(question) if not t.isdigit()}
        wanted = kept - set(tokenize(" ".join(carried))) - ASKING
        copied = {t for e in examples for q in _example_queries(e) for t in tokenize(q)}
        return cls(
            question=question,
            words=frozenset(_bare(w) for w in _WORD.findall(said)),
            tokens=tokens,
            numbers=frozenset(_number(n) for n in _NUMBER.findall(said)),
            wanted=frozenset(wanted),
            example_words=frozenset(copied - tokens),
        )

    def kept_share(self, query: str) -> float:
        """The share of the question's content words ``query`` keeps."""
        if not self.wanted:
            return 1.0
        return len(self.wanted & set(tokenize(query))) / len(self.wanted)

    def refusal(self, query: str) -> str | None:
        """Why ``query`` may not be searched, or None when it may."""
        share = self.kept_share(query)
        if share < REWRITE_KEEPS:
            return f"it leaves out words of the question ({share:.0%} kept)"
        new_numbers = self.unsaid_numbers(query)
        if new_numbers:
            return f"it adds a number the conversation never gave ({new_numbers[0]})"
        new_names = self.unsaid_names(query)
        if new_names:
            return f"it adds a name the conversation never used ({new_names[0]})"
        copied = [w for w in _WORD.findall(query) if set(tokenize(w)) & self.example_words]
        if copied:
            return f"it copies the prompt's example ({copied[0]})"
        return self._statement(query)

    def unsaid_numbers(self, query: str) -> list[str]:
        return [n for n in _NUMBER.findall(query) if _number(n) not in self.numbers]

    def unsaid_names(self, query: str) -> list[str]:
        return [w for w in names(query) if _bare(w) not in self.words and not self._said_token(w)]

    def unsaid(self, query: str) -> list[str]:
        """The numbers and names in ``query`` that the conversation never held."""
        return [*self.unsaid_numbers(query), *self.unsaid_names(query)]

    def _said_token(self, word: str) -> bool:
        stems = tokenize(word)
        return bool(stems) and all(t in self.tokens for t in stems)

    def _statement(self, query: str) -> str | None:
        words = query.split()
        if len(words) > max(MAX_QUERY_WORDS, 2 * len(self.question.split())):
            return f"it is {len(words)} words long: an answer, not a query"
        if len(_ENDS.findall(query)) > max(1, len(_ENDS.findall(self.question))):
            return "it joins more than one question"
        lowered = [_bare(w) for w in _WORD.findall(query)]
        if lowered and lowered[0] in ("yes", "no"):
            return "it answers the question instead of asking it"
        asked = {_bare(w) for w in _WORD.findall(self.question)}
        stating = (_STATING & set(lowered)) - asked
        if stating and lowered and lowered[0] not in _QUESTION_WORDS:
            return f"it states something ({sorted(stating)[0]!r}) instead of asking"
        return None

    def screen(self, queries: Iterable[str], what: str) -> tuple[list[str], list[str]]:
        """The ``queries`` that may be searched, and a note for each one that may not."""
        passed, notes = [], []
        for query in queries:
            reason = self.refusal(query)
            if reason is None:
                passed.append(query)
            else:
                notes.append(f"{what} {query!r} was not searched: {reason}")
        return passed, notes
