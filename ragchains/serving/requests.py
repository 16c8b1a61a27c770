"""Request bodies as the server accepts them: the chains' input types plus size limits and
filters checked against the index, so bad input is a 422 with the reason before any work."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException
from pydantic import BaseModel, field_validator

from chains.graph import AskInput, ChatInput, check_configurable
from chains.retrieve import RetrieveInput
from chains.rewrite import RewriteInput
from prompts.registry import PromptRegistry, PromptSelectionError
from ragchains.settings import Settings
from retrievers.filters import MetadataFilter, validate_filters


@dataclass(frozen=True)
class Limits:
    """The request limits of the settings (``max_*``)."""

    request_bytes: int
    question_chars: int
    history_messages: int
    history_chars: int
    batch_inputs: int

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(
            request_bytes=settings.max_request_bytes,
            question_chars=settings.max_question_chars,
            history_messages=settings.max_history_messages,
            history_chars=settings.max_history_chars,
            batch_inputs=settings.max_batch_inputs,
        )

    def text(self, text: str, what: str) -> str:
        if not text.strip():
            raise ValueError(f"the {what} is empty")
        if len(text) > self.question_chars:
            raise ValueError(
                f"the {what} has {len(text)} characters; the limit is {self.question_chars}"
            )
        return text

    def history(self, history: list[Any]) -> list[Any]:
        if len(history) > self.history_messages:
            raise ValueError(
                f"the chat history has {len(history)} messages; "
                f"the limit is {self.history_messages}"
            )
        chars = sum(len(str(message.content)) for message in history)
        if chars > self.history_chars:
            raise ValueError(
                f"the chat history has {chars} characters; the limit is {self.history_chars}"
            )
        return history


def request_models(limits: Limits, fields: Mapping[str, str]) -> dict[str, type[BaseModel]]:
    """The input model of each served runnable, by route name, for one loaded index."""

    # pydantic passes a second argument to validators that take two: one argument each.
    def question(text: str) -> str:
        return limits.text(text, "question")

    def history(messages: list[Any]) -> list[Any]:
        return limits.history(messages)

    def filters(value: list[MetadataFilter]) -> list[MetadataFilter]:
        return validate_filters(value, fields)

    class ChatRequest(ChatInput):
        _question = field_validator("question")(question)
        _history = field_validator("chat_history")(history)

    class AskRequest(AskInput):
        _question = field_validator("question")(question)
        _filters = field_validator("filters")(filters)

    class RewriteRequest(RewriteInput):
        _question = field_validator("question")(question)
        _history = field_validator("chat_history")(history)

    class RetrieveRequest(RetrieveInput):
        _query = field_validator("query")(lambda text: limits.text(text, "query"))
        _alternatives = field_validator("alternatives")(
            lambda texts: [limits.text(text, "alternative query") for text in texts]
        )
        _filters = field_validator("filters")(filters)

    return {
        "chat": ChatRequest,
        "ask": AskRequest,
        "rewrite": RewriteRequest,
        "retrieve": RetrieveRequest,
    }


def require_configurable(prompts: PromptRegistry, configurable: Any, mode: str) -> None:
    """``check_configurable`` for a request: 400 for an unknown domain or prompt version,
    422 for anything else wrong (unknown key, bad k or threshold)."""
    if not isinstance(configurable, dict):
        raise HTTPException(422, "config.configurable must be an object")
    try:
        check_configurable(prompts, configurable, mode)
    except PromptSelectionError as exc:
        raise HTTPException(400, str(exc)) from exc
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from exc
