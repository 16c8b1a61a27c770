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
from typing import Any, Literal

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ragchains.chains.options import problem_text
from ragchains.factory import Service
from ragchains.serving.errors import classify, error_body
from ragchains.serving.guards import request_json
from ragchains.serving.requests import Route


class OpenAIContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class OpenAIMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_calls, ... are accepted and unused

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[OpenAIContentPart] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        if any(part.type != "text" for part in self.content):
            raise ValueError("only text content parts are supported")
        return "".join(part.text or "" for part in self.content)


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # temperature, max_tokens, ...: the prompt decides

    model: str = Field(description="the prompt domain, e.g. default or hr")
    messages: list[OpenAIMessage] = Field(min_length=1)
    stream: bool = False
    configurable: dict[str, Any] = Field(
        default_factory=dict,
        description="ragchains extension: prompt versions, k, threshold (as on /chat)",
    )


def to_chat_input(messages: list[OpenAIMessage]) -> dict[str, Any]:
    """The last message is the question; earlier user/assistant turns are the history."""
    *earlier, last = messages
    if last.role != "user":
        raise ValueError("the last message must be the user's question")
    history: list[BaseMessage] = []
    for message in earlier:
        if message.role == "user":
            history.append(HumanMessage(message.text()))
        elif message.role == "assistant":
            history.append(AIMessage(message.text()))
    return {"question": last.text(), "chat_history": history}


def openai_router(service: Service, chat: Route) -> APIRouter:
    """``chat`` is the chat chain as /chat serves it, with the same checks of the input and
    of the ``configurable`` choices."""
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
    async def chat_completions(request: Request) -> Any:
        try:
            body = ChatCompletionRequest.model_validate(await request_json(request))
        except json.JSONDecodeError as exc:
            raise HTTPException(422, "the body is not valid JSON") from exc
        except ValidationError as exc:
            raise HTTPException(422, _first_problem(exc)) from exc
        if "domain" in body.configurable:
            raise HTTPException(422, "choose the domain with 'model', not configurable.domain")
        configurable = chat.check({**body.configurable, "domain": body.model})
        try:
            turn = chat.request_model.model_validate(to_chat_input(body.messages))
        except ValidationError as exc:
            raise HTTPException(422, _first_problem(exc)) from exc
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from exc
        config: Any = {"configurable": configurable, "run_name": "chat"}
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
    return problem_text(exc.errors()[0])


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
        frame = self._frame(
            "chat.completion", {"message": message, "finish_reason": "stop"}, details
        )
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
            status, reason, _ = classify(exc)
            yield sse(error_body(path, status, reason))
            raise
        end = {"delta": {}, "finish_reason": "stop"}
        yield sse(self._frame("chat.completion.chunk", end, last))
        yield "data: [DONE]\n\n"
