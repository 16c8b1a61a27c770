"""The re-query stage: when the best compressor score is low, ask the model once for a better
query, search and compress it, and keep the new results only when they are clearly better
(``RequeryPolicy``). A ``RunnableBranch``: a turn whose results are good passes straight on.

The new query is searched and compressed by the turn's own retrieve and compress stages,
composed here on a copy of the state whose search is the new query: the same filters, ``k``
and threshold, and the same contracts, as the first search.
"""

from dataclasses import dataclass
from functools import partial
from typing import Any, NotRequired, cast

from langchain_core.documents import BaseDocumentCompressor
from langchain_core.runnables import Runnable, RunnableBranch, RunnablePassthrough
from pydantic import BaseModel, Field

from ragchains.chains.compress import Compressed
from ragchains.chains.llm import LLM
from ragchains.chains.retrieve import Kept
from ragchains.chains.rewrite import RewriteOutput, expand_glossary, guard_for
from ragchains.chains.state import Call, calling, quick
from ragchains.chains.toolcalls import lines_grammar, parse_alternatives


class RequeryReport(BaseModel):
    first_query: str
    first_best_score: float | None
    query: str | None = Field(None, description="the model's new query; None if unusable")
    refused: str | None = Field(
        None, description="why the new query was not searched (chains.queryguard), if it was not"
    )
    best_score: float | None = None
    kept: bool = Field(False, description="the new query's results replaced the first ones")


@dataclass(frozen=True)
class RequeryPolicy:
    """When to re-query, and when the new results are clearly better.

    ``below``: re-query when the best compressor score is under it; None takes the
    compressor's own (``requery_threshold()``), and with a compressor that reports no scores a
    turn re-queries only when nothing was kept.
    """

    enabled: bool = True
    below: float | None = None
    min_ratio: float = 1.1
    min_gain: float = 0.05

    def keeps(self, old: float, new: float) -> bool:
        return new >= max(old * self.min_ratio, old + self.min_gain)


# ----------------------------------------------------------------------------- the stages
class Requeried(Kept):
    """After ``requery``: when it ran, its report (and the new search, retrieved and
    compressed when its results were kept)."""

    requery: NotRequired[RequeryReport]


class _Asked(Kept):
    """Inside ``requery``: the model's new query, as a report so far."""

    requery: RequeryReport


class _Searched(_Asked):
    """Inside ``requery``: the turn's state as the new query searched and compressed it."""

    again: Kept


class Requery:
    """Asks the model once for a better query when the best score is low; the new results
    replace the first ones only when clearly better.

    ``retrieve`` and ``compress``: the turn's own stages (``chains.retrieve``)."""

    def __init__(
        self,
        llm: LLM,
        retrieve: Runnable[Any, Any],
        compress: Runnable[Any, Any],
        compressor: BaseDocumentCompressor | None,
        policy: RequeryPolicy,
    ) -> None:
        self.llm = llm
        self.retrieve = retrieve
        self.compress = compress
        self.compressor = compressor
        self.policy = policy

    def below(self) -> float | None:
        if self.policy.below is not None:
            return self.policy.below
        own = getattr(self.compressor, "requery_threshold", None)
        return float(own()) if callable(own) else None

    def wanted(self, state: Kept) -> bool:
        compressed: Compressed = state["compressed"]
        if not self.policy.enabled or self.compressor is None:
            return False
        if compressed.best_score is None:
            # No scores to compare: worth a try only when nothing was kept from something.
            return not compressed.documents and bool(state["retrieved"].documents)
        below = self.below()
        return below is not None and compressed.best_score < below

    def better(self, old: Compressed, new: Compressed) -> bool:
        if new.best_score is None or old.best_score is None:
            return bool(new.documents) and not old.documents
        return self.policy.keeps(old.best_score, new.best_score)

    def ask(self, state: Kept) -> Call:
        """The model asked once for a better query; its reply read into the report."""
        prompt = state["options"].prompt("requery")
        chain = self.llm.text(prompt, grammar=lines_grammar(1))
        variables = {"question": state["question"], "previous_query": state["search"].search_query}
        return Call(chain, variables, partial(self.report, state))

    @staticmethod
    def report(state: Kept, reply: str) -> RequeryReport:
        """A usable query that differs from the one already searched (or None), and why it
        may not be searched (``QueryGuard``), or None when it may."""
        search: RewriteOutput = state["search"]
        report = RequeryReport(
            first_query=search.search_query, first_best_score=state["compressed"].best_score
        )
        fresh = parse_alternatives(reply, main=search.search_query, count=1)
        if fresh:
            guard = guard_for(state, state.get("chat_history") or [], search.filters, "requery")
            report.query = expand_glossary(fresh[0], state["options"].glossary)
            report.refused = guard.refusal(fresh[0])
        return report

    @staticmethod
    def searchable(state: _Asked) -> bool:
        return bool(state["requery"].query) and state["requery"].refused is None

    @staticmethod
    def searching_again(state: _Asked) -> Kept:
        """The turn's state with the new query as its search: the same filters, no other
        phrasings."""
        update: dict[str, Any] = {"search_query": state["requery"].query, "alternatives": []}
        return cast(Kept, {**state, "search": state["search"].model_copy(update=update)})

    def compared(self, state: _Searched) -> Requeried:
        """The report with the new results' best score; the new search, retrieved and
        compressed when they are clearly better."""
        again = state["again"]
        report = state["requery"].model_copy(update={"best_score": again["compressed"].best_score})
        turn: dict[str, Any] = {key: value for key, value in state.items() if key != "again"}
        if self.better(state["compressed"], again["compressed"]):
            report.kept = True
            turn.update(search=again["search"], retrieved=again["retrieved"])
            turn.update(compressed=again["compressed"])
        return cast(Requeried, {**turn, "requery": report})

    def stage(self) -> Runnable[Any, Requeried]:
        """The ``requery`` stage: a branch that re-queries when the best score is low
        (``wanted``) and passes the state on unchanged otherwise."""
        again = (
            quick(self.searching_again, name="requery_state", needs=("requery", "search"))
            | RunnablePassthrough.assign(retrieved=self.retrieve)
            | RunnablePassthrough.assign(compressed=self.compress)
        )
        searched = RunnablePassthrough.assign(again=again) | quick(
            self.compared, name="requery_compare", needs=("again", "requery", "compressed")
        )
        needs = ("options", "question", "search", "compressed")
        requery = RunnablePassthrough.assign(
            requery=calling(self.ask, name="requery_ask", needs=needs)
        ) | RunnableBranch(
            (quick(self.searchable, name="requery_searchable"), searched), RunnablePassthrough()
        )
        # Named, not bound to a run_name: a binding under a branch reports its run as the
        # branch's sibling (it merges in the config of the run around the branch).
        requery.name = "requery_search"
        wanted = quick(self.wanted, name="requery_wanted")
        branch: RunnableBranch[Any, Any] = RunnableBranch((wanted, requery), RunnablePassthrough())
        branch.name = "requery"  # its node in get_graph(), its run in astream_events
        return branch
