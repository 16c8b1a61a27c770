"""The re-query stage: when the best compressor score is low, ask the model once for a better
query, search and compress it, and keep the new results only when they are clearly better
(``RequeryPolicy``). A ``RunnableBranch``: a turn whose results are good passes straight on.
"""

import time
from dataclasses import dataclass
from typing import Any, NotRequired, cast

from langchain_core.documents import BaseDocumentCompressor
from langchain_core.runnables import (
    Runnable,
    RunnableBranch,
    RunnableConfig,
    RunnableLambda,
    RunnablePassthrough,
)
from pydantic import BaseModel, Field

from ragchains.chains.compress import Compressed, acompress, compress, threshold_for
from ragchains.chains.llm import LLM
from ragchains.chains.options import Options
from ragchains.chains.retrieve import Kept, Retrieved, Searcher
from ragchains.chains.rewrite import RewriteOutput, expand_glossary, guard_for
from ragchains.chains.state import quick
from ragchains.chains.toolcalls import lines_grammar, parse_alternatives
from ragchains.retrievers.compressors import ScoringCompressor


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
    requery_prompt: NotRequired[str]
    requery_seconds: NotRequired[float]


class Requery:
    """Asks the model once for a better query when the best score is low; the new results
    replace the first ones only when clearly better."""

    def __init__(
        self,
        llm: LLM,
        searcher: Searcher,
        compressor: BaseDocumentCompressor | None,
        policy: RequeryPolicy,
    ) -> None:
        self.llm = llm
        self.searcher = searcher
        self.compressor = compressor
        self.policy = policy

    def below(self) -> float | None:
        if self.policy.below is not None:
            return self.policy.below
        if isinstance(self.compressor, ScoringCompressor):
            return self.compressor.requery_threshold()
        return None

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

    def _ask(self, state: Kept) -> tuple[Runnable[Any, str], dict[str, Any]]:
        prompt = state["options"].prompt("requery")
        chain = self.llm.text(prompt, grammar=lines_grammar(1))
        variables = {"question": state["question"], "previous_query": state["search"].search_query}
        return chain, variables

    @staticmethod
    def _new_query(state: Kept, reply: str) -> tuple[str | None, str | None]:
        """A usable query that differs from the one already searched (or None), and why it
        may not be searched (``QueryGuard``), or None when it may."""
        search: RewriteOutput = state["search"]
        fresh = parse_alternatives(reply, main=search.search_query, count=1)
        if not fresh:
            return None, None
        guard = guard_for(state, state.get("chat_history") or [], search.filters, "requery")
        return expand_glossary(fresh[0], state["options"].glossary), guard.refusal(fresh[0])

    def _result(
        self,
        state: Kept,
        new_query: tuple[str | None, str | None],
        found: tuple[Retrieved, Compressed] | None,
        since: float,
    ) -> Requeried:
        search: RewriteOutput = state["search"]
        old: Compressed = state["compressed"]
        query, refused = new_query
        report = RequeryReport(
            first_query=search.search_query,
            first_best_score=old.best_score,
            query=query,
            refused=refused,
        )
        update: dict[str, Any] = {}
        if query and found is not None:
            retrieved, new = found
            report.best_score = new.best_score
            if self.better(old, new):
                report.kept = True
                update = {
                    "search": search.model_copy(update={"search_query": query, "alternatives": []}),
                    "retrieved": retrieved,
                    "compressed": new,
                }
        return cast(
            Requeried,
            {
                **state,
                **update,
                "requery": report,
                "requery_prompt": state["options"].prompt("requery").ref,
                "requery_seconds": round(time.perf_counter() - since, 4),
            },
        )

    def __call__(self, state: Kept, config: RunnableConfig) -> Requeried:
        since = time.perf_counter()
        chain, variables = self._ask(state)
        new_query = self._new_query(state, chain.invoke(variables, config))
        found = None
        query, refused = new_query
        if query and refused is None:
            options: Options = state["options"]
            retrieved = self.searcher.search(
                query, filters=state["search"].filters, k=options.k, config=config
            )
            new = compress(
                self.compressor,
                retrieved.documents,
                query,
                threshold=threshold_for(options, self.compressor),
                config=config,
            )
            found = (retrieved, new)
        return self._result(state, new_query, found, since)

    def stage(self) -> Runnable[Any, Requeried]:
        """The ``requery`` stage: a branch that re-queries when the best score is low
        (``wanted``) and passes the state on unchanged otherwise."""
        requery = RunnableLambda(self, afunc=self.acall, name="requery_search")
        wanted = quick(self.wanted, name="requery_wanted")
        branch: RunnableBranch[Any, Any] = RunnableBranch((wanted, requery), RunnablePassthrough())
        branch.name = "requery"  # its node in get_graph(), its run in astream_events
        return branch

    async def acall(self, state: Kept, config: RunnableConfig) -> Requeried:
        since = time.perf_counter()
        chain, variables = self._ask(state)
        new_query = self._new_query(state, await chain.ainvoke(variables, config))
        found = None
        query, refused = new_query
        if query and refused is None:
            options: Options = state["options"]
            retrieved = await self.searcher.asearch(
                query, filters=state["search"].filters, k=options.k, config=config
            )
            new = await acompress(
                self.compressor,
                retrieved.documents,
                query,
                threshold=threshold_for(options, self.compressor),
                config=config,
            )
            found = (retrieved, new)
        return self._result(state, new_query, found, since)
