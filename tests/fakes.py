"""Fake chat models for unit tests of the logic around the LLM (never the product path)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.outputs import ChatGenerationChunk
from pydantic import Field


class RecordingModel(FakeListChatModel):
    """Replies from a list, streamed character by character; records every call's messages
    and keyword arguments (temperature, grammar, ...)."""

    seen: list = Field(default_factory=list)
    kwargs: list = Field(default_factory=list)

    def _record(self, messages: Any, kwargs: dict[str, Any]) -> None:
        self.seen.append(messages)
        self.kwargs.append(kwargs)

    def _call(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any) -> str:
        self._record(messages, kw)
        return super()._call(messages, stop, run_manager, **kw)

    def _stream(
        self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> Iterator[ChatGenerationChunk]:
        self._record(messages, kw)
        return super()._stream(messages, stop, run_manager, **kw)

    @property
    def grammars(self) -> list[Any]:
        return [kw.get("grammar") for kw in self.kwargs]


class NoCallModel(FakeListChatModel):
    """Fails the test if anything calls it."""

    responses: list = Field(default_factory=lambda: ["unused"])

    def _call(self, *args: Any, **kwargs: Any) -> str:
        raise AssertionError("the LLM must not be called")

    def _stream(self, *args: Any, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        raise AssertionError("the LLM must not be called")
