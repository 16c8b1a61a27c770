"""OpenAI-compatible chat completions over the chat graph, for clients that speak that API.

``model`` names the prompt domain (``GET /v1/models`` lists them). The conversation's last
message is the question and the earlier user and assistant messages are the history; system
messages and sampling parameters are ignored, because the domain's versioned prompt files
decide both. What the answer rests on travels in an extra ``ragchains`` field: the sources on
the first stream chunk (and the whole turn's details on a non-streamed reply), citations and
timings on the last.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, model_validator

from ragchains.chains.options import problem_text
from ragchains.factory import Service
from ragchains.models.queue import Ticket, with_ticket
from ragchains.serving.admission import admit
from ragchains.serving.bodies import MALFORMED, JsonBody
from ragchains.serving.errors import error_body, failed
from ragchains.serving.requests import Limits, Route
from ragchains.textrules import SAYS_SOMETHING, text_type

# The question is the last user message, so there must be one (JSON Schema's ``contains``).
_HAS_A_QUESTION: dict[str, Any] = {
    "contains": {"type": "object", "properties": {"role": {"const": "user"}}}
}
# A user's words as parts: one of them at least says something. (Their joined length is
# checked as the question's, which JSON Schema cannot state.)
_SAYS_SOMETHING: dict[str, Any] = {
    "contains": {
        "type": "object",
        "properties": {"text": {"pattern": SAYS_SOMETHING}},
        "required": ["text"],
    }
}


def completion_request(limits: Limits) -> type[BaseModel]:
    """The body /v1/chat/completions reads, within ``limits``: each user message's text is
    checked as a question, the others' as history."""
    question = text_type("question", limits.question_chars)
    said = text_type("message", limits.history_chars, blank=True)

    class ContentPart(BaseModel):
        """A text part of a message's content (the only kind read)."""

        model_config = ConfigDict(extra="allow", title="OpenAIContentPart")
        type: Literal["text"]
        text: said  # type: ignore[valid-type]

    parts = list[ContentPart]
    asked = Annotated[parts, Field(min_length=1, json_schema_extra=_SAYS_SOMETHING)]

    class UserMessage(BaseModel):
        model_config = ConfigDict(extra="allow")  # name, ...: accepted and unused
        role: Literal["user"]
        content: question | asked  # type: ignore[valid-type]

    class AssistantMessage(BaseModel):
        model_config = ConfigDict(extra="allow")  # tool_calls, ...: accepted and unused
        role: Literal["assistant"]
        content: said | parts | None = None  # type: ignore[valid-type]

    class OtherMessage(BaseModel):
        """Instructions and tool results: accepted and not read (the domain's prompt
        decides)."""

        model_config = ConfigDict(extra="allow")
        role: Literal["system", "developer", "tool"]
        content: said | parts | None = None  # type: ignore[valid-type]

    message = Annotated[UserMessage | AssistantMessage | OtherMessage, Field(discriminator="role")]

    class ChatCompletionRequest(BaseModel):
        model_config = ConfigDict(extra="allow")  # temperature, max_tokens: the prompt decides

        model: str = Field(description="the prompt domain, e.g. default or hr")
        messages: list[message] = Field(  # type: ignore[valid-type]
            min_length=1,
            max_length=limits.history_messages + 1,
            description="the conversation: its last user message is the question, the user "
            "and assistant messages before it the history; system, developer and tool "
            "messages, and any message after the question, are not read",
            json_schema_extra=_HAS_A_QUESTION,
        )
        stream: StrictBool = False
        configurable: dict[str, Any] = Field(
            default_factory=dict,
            description="ragchains extension: prompt versions, k, threshold (as on /chat)",
        )

        @model_validator(mode="after")
        def _has_a_question(self) -> Any:
            if not any(m.role == "user" for m in self.messages):
                raise ValueError("the conversation has no user message to answer")
            return self

    return ChatCompletionRequest


def _words(content: Any) -> str:
    """A message's text: its content, or its text parts joined."""
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(part.text for part in content)


def to_chat_input(messages: list[Any]) -> dict[str, Any]:
    """The last user message is the question; the user and assistant messages before it are
    the history."""
    last = max(n for n, message in enumerate(messages) if message.role == "user")
    history: list[BaseMessage] = []
    for message in messages[:last]:
        if message.role == "user":
            history.append(HumanMessage(_words(message.content)))
        elif message.role == "assistant":
            history.append(AIMessage(_words(message.content)))
    return {"question": _words(messages[last].content), "chat_history": history}


def openai_router(
    service: Service, chat: Route, completion: type[BaseModel], ticket: Any
) -> APIRouter:
    """``chat`` is the chat chain as /chat serves it, with the same checks of the input and
    of the ``configurable`` choices; ``completion``: the body's model (``completion_request``);
    ``ticket``: the dependency that gives a request its ticket for the model's queue
    (``admission.model_ticket``)."""
    router = APIRouter(prefix="/v1", tags=["openai"])

    @router.get("/models")
    async def models() -> dict[str, Any]:
        domains = service.prompts.domains.values()
        return {
            "object": "list",
            "data": [
                {
                    "id": domain.name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "ragchains",
                    "description": domain.description,
                }
                for domain in domains
            ],
        }

    @router.post("/chat/completions")
    async def chat_completions(request: Request, sent: JsonBody, held: Ticket = ticket) -> Any:
        if sent is MALFORMED:
            raise HTTPException(422, "the body is not valid JSON")
        try:
            body: Any = completion.model_validate(sent)
        except ValidationError as exc:
            raise HTTPException(422, _first_problem(exc)) from exc
        if "domain" in body.configurable:
            raise HTTPException(422, "choose the domain with 'model', not configurable.domain")
        configurable = chat.resolve({**body.configurable, "domain": body.model})
        try:
            turn = chat.request_model.model_validate(to_chat_input(body.messages))
        except ValidationError as exc:
            raise HTTPException(422, _first_problem(exc)) from exc
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from exc
        config: Any = {"configurable": with_ticket(configurable, held), "run_name": "chat"}
        admit(held, service.llm)  # 503 now, not in a started stream
        reply = _Reply(body.model)
        if not body.stream:
            result = await chat.runnable.ainvoke(turn, config)
            return reply.completion(result)
        events = chat.runnable.astream(turn, config).__aiter__()
        # The first event (sources) comes after the rewrite and the search: waiting for it
        # lets a failing model still get a proper status instead of a broken stream.
        head = await events.__anext__()
        return StreamingResponse(
            reply.chunks(head, events, request.url.path),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return router


def _first_problem(exc: ValidationError) -> str:
    """The problem to name: for a value of several kinds (text or parts), the one in the
    kind that was sent, not the other kind's "should be a valid ..."."""
    errors = exc.errors()
    return problem_text(next((e for e in errors if not e["type"].endswith("_type")), errors[0]))


class _Reply:
    """One completion's id and framing, streamed or not."""

    def __init__(self, model: str) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model

    def _frame(self, kind: str, choice: dict[str, Any], extra: dict[str, Any] | None) -> Any:
        frame: dict[str, Any] = {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "logprobs": None, **choice}],
        }
        if extra is not None:
            frame["ragchains"] = extra
        return frame

    def completion(self, result: dict[str, Any]) -> JSONResponse:
        message = {"role": "assistant", "content": result.get("answer", "")}
        details = {key: value for key, value in result.items() if key != "answer"}
        choice = {"message": message, "finish_reason": _finish_reason(result)}
        frame = self._frame("chat.completion", choice, details)
        return JSONResponse(frame)

    async def chunks(
        self, head: dict[str, Any], events: AsyncIterator[dict[str, Any]], path: str
    ) -> AsyncIterator[str]:
        def sse(payload: Any) -> str:
            return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

        first = {"delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        yield sse(self._frame("chat.completion.chunk", first, dict(head)))
        last: dict[str, Any] = {}
        try:
            async for event in events:
                if "answer" in event:
                    delta = {"delta": {"content": event["answer"]}, "finish_reason": None}
                    yield sse(self._frame("chat.completion.chunk", delta, None))
                last.update({k: v for k, v in event.items() if k != "answer"})
        except Exception as exc:
            # Headers are sent: the error travels as an event, which OpenAI SDKs raise.
            failure = failed(exc)
            yield sse(error_body(path, failure.status, failure.reason))
            raise
        end = {"delta": {}, "finish_reason": _finish_reason(last)}
        yield sse(self._frame("chat.completion.chunk", end, last))
        yield "data: [DONE]\n\n"


def _finish_reason(turn: dict[str, Any]) -> str:
    """OpenAI's word for an answer cut short (the model's reply broke off or reached its
    token limit) is "length": a client must not take the fragment for a finished answer."""
    return "length" if turn.get("incomplete") else "stop"
