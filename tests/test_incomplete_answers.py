"""A model reply cut short is an incomplete answer, never a finished one (issue 30, case 3).

An upstream whose stream stops after three words without a ``finish_reason`` or ``[DONE]``
("cut"), or says its token limit stopped it (``finish_reason: "length"``, "capped"): the turn
keeps the words that arrived, flagged ``incomplete`` with a note saying why, on /chat and /ask
(invoke and stream), as ``finish_reason: "length"`` on /v1/chat/completions (through the
OpenAI SDK), in the MCP ``ask`` tool and on the chat page; through `ragchains serve` as a user
starts it, and with the real embedded model at its token limit.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from langchain_core.exceptions import ModelConnectionError
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage

from ragchains.chains.answer import BROKE_OFF_NOTE, TOKEN_LIMIT_NOTE, create_answer_chain
from ragchains.chains.llm import LLM, grammar_keyword
from ragchains.serving.mcp_server import INCOMPLETE
from tests.servers import CUT_SHORT, FakeOpenAI, ragchains_serve
from tests.test_answer_chain import DOCS
from tests.test_chat_page import ChatPage, fact
from tests.test_mcp import call, over_http, structured
from tests.test_prometheus import moved, scrape

pytestmark = pytest.mark.slow

QUESTION = "How many days of paid time off do full-time employees get?"
CUT_NOTES = {"cut": BROKE_OFF_NOTE, "capped": TOKEN_LIMIT_NOTE}


@pytest.fixture(scope="module")
def served(serve_upstream: Callable[..., AbstractContextManager[str]]) -> Iterator[str]:
    with serve_upstream(openai_model="ok-main") as base:
        yield base


@contextmanager
def behaving(upstream: FakeOpenAI, behaviour: str) -> Iterator[None]:
    upstream.behave_as = behaviour
    try:
        yield
    finally:
        upstream.behave_as = None


def invoked(base: str, route: str) -> dict[str, Any]:
    response = httpx.post(
        f"{base}/{route}/invoke", json={"input": {"question": QUESTION}}, timeout=120
    )
    assert response.status_code == 200, response.text
    return dict(response.json()["output"])


def streamed(base: str, route: str) -> tuple[list[str], dict[str, Any]]:
    """A /stream's event names, and its data events added up as LangServe adds them."""
    names: list[str] = []
    merged: dict[str, Any] = {}
    body = {"input": {"question": QUESTION}}
    with httpx.stream("POST", f"{base}/{route}/stream", json=body, timeout=120) as response:
        assert response.status_code == 200
        text = response.read().decode()
    for block in text.replace("\r\n", "\n").strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        names.append(lines.get("event", ""))
        if lines.get("event") == "data":
            for key, value in json.loads(lines["data"]).items():
                added = key in ("answer", "notes") and key in merged
                merged[key] = merged[key] + value if added else value
    return names, merged


def assert_incomplete(out: dict[str, Any], behaviour: str) -> None:
    assert out["answer"].strip() == CUT_SHORT
    assert out["incomplete"] is True, out
    assert CUT_NOTES[behaviour] in out["notes"]
    assert out["abstained"] is False


# ----------------------------------------------------------------------------- HTTP routes
def test_a_reply_that_breaks_off_is_answered_incomplete_on_invoke_and_stream(
    served: str, upstream: FakeOpenAI
) -> None:
    """The words that arrived, flagged with the note, status 200; a stream ends with its
    ending event and `end`, not an error event nor a clean finished answer. It was a 502 on
    invoke and an error event after the words on stream."""
    before = scrape(served, {})
    with behaving(upstream, "cut"):
        for route in ("chat", "ask"):
            assert_incomplete(invoked(served, route), "cut")
            names, merged = streamed(served, route)
            assert "error" not in names and names[-1] == "end", names
            assert_incomplete(merged, "cut")
    finished = invoked(served, "chat")  # the upstream answers whole again
    assert finished["incomplete"] is False
    assert not set(CUT_NOTES.values()) & set(finished["notes"])
    # No longer an error: a model that keeps breaking off shows in the metrics.
    after = scrape(served, {})
    for chain in ("chat", "ask"):
        assert moved(before, after, "ragchains_incomplete_answers_total", chain=chain) == 2


def test_an_upstream_token_limit_is_an_incomplete_answer(served: str, upstream: FakeOpenAI) -> None:
    """finish_reason "length": the reply is whole as far as the server is concerned, but cut
    by its token limit. It was served as a finished answer."""
    with behaving(upstream, "capped"):
        assert_incomplete(invoked(served, "ask"), "capped")
        names, merged = streamed(served, "chat")
    assert names[-1] == "end"
    assert_incomplete(merged, "capped")


@pytest.mark.parametrize("behaviour", ["cut", "capped"])
def test_v1_ends_an_incomplete_answer_with_finish_reason_length(
    served: str, upstream: FakeOpenAI, behaviour: str
) -> None:
    """Through the OpenAI SDK, streamed and not: "length", never "stop"."""
    client = openai.OpenAI(base_url=f"{served}/v1", api_key="unused", max_retries=0)
    messages: Any = [{"role": "user", "content": QUESTION}]
    with behaving(upstream, behaviour):
        chunks = list(
            client.chat.completions.create(model="default", messages=messages, stream=True)
        )
        whole = client.chat.completions.create(model="default", messages=messages)
    assert "".join(c.choices[0].delta.content or "" for c in chunks).strip() == CUT_SHORT
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].model_extra and chunks[-1].model_extra["ragchains"]["incomplete"] is True
    assert whole.choices[0].finish_reason == "length"
    assert (whole.choices[0].message.content or "").strip() == CUT_SHORT
    assert whole.model_extra and CUT_NOTES[behaviour] in whole.model_extra["ragchains"]["notes"]
    finished = client.chat.completions.create(model="default", messages=messages)
    assert finished.choices[0].finish_reason == "stop"


# ----------------------------------------------------------------------------- as a user runs it
def test_ragchains_serve_marks_a_cut_answer_incomplete_over_http_v1_and_mcp(
    sample_index: Path, upstream: FakeOpenAI, tmp_path: Path
) -> None:
    """`ragchains serve` with the openai provider on an upstream whose model "cut" breaks
    off every stream after three words."""
    env = {
        "RAGCHAINS_LLM_PROVIDER": "openai",
        "RAGCHAINS_OPENAI_BASE_URL": upstream.base_url,
        "RAGCHAINS_OPENAI_MODEL": "cut",
        "RAGCHAINS_LLM_MAX_RETRIES": "0",
        "RAGCHAINS_FEEDBACK_DB": str(tmp_path / "feedback.sqlite"),
    }
    with ragchains_serve("--index", str(sample_index), **env) as base:
        assert_incomplete(invoked(base, "ask"), "cut")
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        chunks = list(
            client.chat.completions.create(
                model="default", messages=[{"role": "user", "content": QUESTION}], stream=True
            )
        )
        assert chunks[-1].choices[0].finish_reason == "length"
        result = over_http(base, "unused", call("ask", {"question": QUESTION}))
    answer = structured(result)
    assert answer["incomplete"] is True and answer["abstained"] is False
    assert answer["answer"].strip() == CUT_SHORT
    assert result.content[0].text.endswith(INCOMPLETE)  # type: ignore[union-attr]


# ----------------------------------------------------------------------------- the page
@pytest.mark.browser
def test_the_chat_page_marks_a_cut_answer_incomplete(
    browser: Any, served: str, upstream: FakeOpenAI
) -> None:
    chat = ChatPage.open(browser, served, (1024, 768))
    try:
        with behaving(upstream, "cut"):
            answer = chat.wait_done(chat.ask(QUESTION))
        assert answer.get_by_text("Incomplete", exact=True).is_visible()
        assert "cut short" in answer.locator("p.incomplete").inner_text()
        assert CUT_SHORT in answer.locator(".answer-text").inner_text()
        assert answer.get_by_role("alert").count() == 0  # an answer, not an error
        assert chat.page.get_by_role("status").inner_text().startswith("Answer incomplete")
        # The note said with the ending is added to those said first, not put in their place.
        notes = fact(chat.thoughts(chat.page.locator(".turn").last), "Notes")
        assert BROKE_OFF_NOTE in notes and "searching your words" in notes
        chat.watched.assert_clean()
    finally:
        chat.page.close()


# ----------------------------------------------------------------------------- the chain
class DropsMidway(GenericFakeChatModel):
    """Streams its message word by word, then its connection drops after ``words`` chunks
    (langchain-openai raises a ``ModelConnectionError`` then)."""

    words: int = 3

    def _stream(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for n, chunk in enumerate(super()._stream(*args, **kwargs)):
            if n == self.words:
                raise ModelConnectionError("Connection error.")
            yield chunk


def dropping(words: int) -> Any:
    message = AIMessage("Hotels cost up to $220 [travel.pdf#page=2].")
    model = DropsMidway(messages=iter([message]), words=words)
    return create_answer_chain(llm=LLM(model=model, name="drops"))


def test_a_model_failing_mid_answer_is_incomplete_and_before_it_a_failure() -> None:
    out = dropping(3).invoke({"question": "hotel costs?", "documents": DOCS})
    assert out["answer"] == "Hotels cost"  # three chunks: words and the blank between
    assert out["incomplete"] is True and out["notes"][-1] == BROKE_OFF_NOTE
    events = list(dropping(3).stream({"question": "hotel costs?", "documents": DOCS}))
    assert events[-1]["incomplete"] is True
    with pytest.raises(ModelConnectionError):
        dropping(0).invoke({"question": "hotel costs?", "documents": DOCS})


def test_the_embedded_model_at_its_token_limit_is_incomplete_its_finished_answers_are_not(
    smollm: LLM,
) -> None:
    """llama.cpp says finish_reason "length" when max_tokens stops it and "stop" when its
    grammar or the model ends the reply: only the first is flagged."""
    inputs = {"question": "How much does a hotel cost per night?", "documents": DOCS}
    finished = create_answer_chain(llm=smollm).invoke(inputs)
    assert finished["incomplete"] is False and finished["answer"], finished
    # The prompt's max_tokens (256) replaced by 4: the answer cannot be finished in that.
    capped = dataclasses.replace(smollm, call_options=lambda _, gbnf: grammar_keyword(4, gbnf))
    out = create_answer_chain(llm=capped, answer_style="free").invoke(inputs)
    assert out["incomplete"] is True and out["notes"][-1] == TOKEN_LIMIT_NOTE
    assert 0 < len(out["answer"]) < 40
