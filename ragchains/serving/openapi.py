"""The OpenAPI document as the server behaves: every status a route can answer, with the
body it carries, event streams as ``text/event-stream``, uploads' files as binary parts, and
only the routes a client calls.

FastAPI documents each route from its handler's signature, and LangServe documents its
routes through stand-in handlers: neither knows the replies made before a route runs (the
key, the body's checks) or after it has started (a failed model, an unreachable store), nor
that LangServe streams events. A client generated from the document must work, so the
document is amended once, when first asked for.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from ragchains.chains.options import DOMAIN_KEY
from ragchains.prompts.registry import DEFAULT_DOMAIN, PromptRegistry
from ragchains.retrievers.filters import filters_schema
from ragchains.serving.errors import OPENAI_PREFIX
from ragchains.serving.guards import is_open
from ragchains.serving.requests import BODY_KEYS, Limits, Route

# LangServe's endpoints that stream server-sent events, by the last part of their path.
STREAMING = frozenset(BODY_KEYS) - {"invoke", "batch"}
# LangServe's endpoints that run a chain, so a model or the store can fail under them.
RUNNING = frozenset(BODY_KEYS)  # the endpoints whose bodies check_body reads
# What a status means, as each response says it.
MEANING = {
    400: "Bad request: the body is not UTF-8 JSON, nests too deep, holds a number of more "
    f"than {sys.get_int_max_str_digits():,} digits or a lone surrogate escape, or a domain or "
    "prompt version that does not exist was chosen",
    401: "Missing or wrong API key",
    408: "The request body did not arrive in time",
    413: "The request body, or a batch, is too large",
    415: "The request body is not JSON (send Content-Type: application/json)",
    422: "The request is invalid; the reason names where",
    502: "The chat model failed or answered something that is not a reply",
    503: "The document store cannot be reached, or an index file was found damaged",
    504: "The chat model timed out",
}
BODY_CHECKS = (400, 408, 413, 415, 422)  # BodyLimits and the routes' own checks
MODEL_FAILURES = (502, 504)  # serving.errors.failed: the chat model failed, timed out
MODEL_FREE = frozenset({"retrieve"})  # routes whose chain calls no model

PROBLEM = {
    "title": "Problem",
    "description": "Why the request failed: a sentence, or for invalid input a list of "
    "problems, each naming where (loc) when it can.",
    "type": "object",
    "required": ["detail"],
    "properties": {
        "detail": {
            "anyOf": [
                {"type": "string"},
                {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["msg"],
                        "properties": {
                            "loc": {
                                "type": "array",
                                "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                            },
                            "msg": {"type": "string"},
                            "type": {"type": "string"},
                        },
                    },
                },
            ]
        }
    },
}
OPENAI_ERROR = {
    "title": "OpenAIError",
    "description": "An error as OpenAI's API reports it, which OpenAI SDKs read.",
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": "null"},
                "code": {"type": "integer"},
            },
        }
    },
}
# Server-sent events, each as a client parses it (clients, schemathesis among them, check
# every event against this).
EVENT_STREAM = {
    "text/event-stream": {
        "schema": {
            "type": "object",
            "properties": {
                "event": {"type": "string"},
                "data": {"type": "string"},
                "id": {"type": "string"},
            },
        }
    }
}
# A request each route answers, shown in /docs ("Try it out") and sent first by fuzzers.
EXAMPLE_INPUTS = {
    "chat": {"question": "What does the standard plan cost?"},
    "ask": {"question": "What does the standard plan cost?"},
    "rewrite": {"question": "And the premium one?"},
    "retrieve": {"query": "standard plan cost"},
}
# LangServe's request bodies, by the end of their schemas' names (e.g. chatInvokeRequest).
_ENVELOPES = tuple(
    f"{kind}Request" for kind in ("Invoke", "Batch", "Stream", "StreamLog", "StreamEvents")
)
REF_TEMPLATE = "#/components/schemas/{model}"
# FastAPI's own 422 body, which the server never sends (see server.invalid_input).
_FASTAPI_422 = ("HTTPValidationError", "ValidationError")
MULTIPART = "multipart/form-data"
# What a status means for a multipart body (an upload), where MEANING's words are of JSON.
# A route's own word for a status comes first (serving.documents declares its refusals).
MULTIPART_MEANING = {
    400: "The body is not multipart/form-data that can be parsed, or holds more files than "
    "an upload takes (RAGCHAINS_MAX_UPLOAD_FILES)",
    413: "The request body is over the limit of an upload (its files, each at most "
    "RAGCHAINS_MAX_UPLOAD_MB, at most RAGCHAINS_MAX_UPLOAD_FILES of them)",
    415: "A file's content is not what its name says, or is of a type not read",
}
# The documents API's routes that read the collection (the index folder or the store), so
# an unreachable store or a damaged index file answers them 503.
COLLECTION_PREFIX = "/documents"
# A document's path is its name in the collection, folders and all: /documents/hr/a.pdf.
DOCUMENT_PATH = (
    "the document's path in the collection (folder/…/file name, as GET /documents lists it)"
)
DOCUMENT_PATH_EXAMPLE = "hr/policies/handbook.pdf"
JOB_LOCATION = {
    "Location": {
        "description": "the job's URL (GET it for the job's progress, or its /events)",
        "required": True,
        "schema": {"type": "string"},
    }
}


def truthful_openapi(
    app: FastAPI,
    *,
    chat_request: type[BaseModel],
    run_request: type[BaseModel] | None = None,
    prompts: PromptRegistry,
    keyed: bool,
    routes: Mapping[str, Route],
    limits: Limits,
    fields: Mapping[str, str] | None,
) -> Callable[[], dict[str, Any]]:
    """``app.openapi``: FastAPI's document, amended. ``chat_request`` is the body
    /v1/chat/completions reads (its handler parses it itself, to answer in OpenAI's error
    format), whose ``model`` is one of the domains of ``prompts``; ``keyed``: the server
    needs an API key. ``routes`` and ``limits``: what the LangServe routes' bodies are
    checked against (``check_body``); ``fields``: the index's filterable fields (which
    follow the index), or None when they are not told (per-user access), whose filters the
    document then leaves untyped. The document is built again when the fields change (an
    ingest adds some) or the prompts do (a domains folder followed live)."""
    built: dict[str, Any] = {}

    def openapi() -> dict[str, Any]:
        now = dict(fields) if fields is not None else None
        loaded = prompts.current()
        if "document" not in built or built["fields"] != now or built["prompts"] is not loaded:
            app.openapi_schema = None
            try:
                document = FastAPI.openapi(app)
                _amend(document, chat_request, sorted(loaded.domains), keyed)
                schemas = document["components"]["schemas"]
                _amend_requests(schemas, routes, limits, now)
                if "chat" in routes:
                    _amend_completions(schemas[chat_request.__name__], routes["chat"])
                    if run_request is not None:
                        _amend_runs(document, run_request, routes["chat"])
            except BaseException:  # FastAPI cached its own document: never serve that one
                app.openapi_schema = None
                raise
            built["fields"], built["prompts"], built["document"] = now, loaded, document
        return built["document"]  # type: ignore[no-any-return]

    return openapi


def _amend_requests(
    schemas: dict[str, Any],
    routes: Mapping[str, Route],
    limits: Limits,
    fields: Mapping[str, str] | None,
) -> None:
    """The LangServe routes' bodies as ``check_body`` checks them: each config with its
    bounds and each domain's prompt versions, a batch's inputs within the limit and its list
    of configs one per input, filters typed by the index's fields."""
    for name, route in routes.items():
        envelope = schemas[f"{name}InvokeRequest"]["properties"]["config"]["$ref"]
        config = route.config_schema(REF_TEMPLATE)
        for nested, schema in config.pop("$defs", {}).items():
            schemas.setdefault(nested, schema)
        schemas[envelope.rsplit("/", 1)[-1]] = config
        batch = schemas[f"{name}BatchRequest"]
        batch["properties"]["inputs"]["maxItems"] = limits.batch_inputs
        # One config for all inputs, or a list with one per input: JSON Schema relates two
        # lists' lengths only case by case, one per batch size the limit allows.
        batch["anyOf"] = [
            {"not": {"required": ["config"]}},
            {"properties": {"config": {"type": "object"}}},
            *(
                {
                    "properties": {
                        "inputs": {"minItems": n, "maxItems": n},
                        "config": {"type": "array", "minItems": n, "maxItems": n},
                    }
                }
                for n in range(1, limits.batch_inputs + 1)
            ),
        ]
    if fields is None:
        return
    typed = filters_schema(fields)
    for schema in schemas.values():
        listed = schema.get("properties", {}).get("filters")
        if listed is not None and listed.get("items") == _ref("MetadataFilter"):
            listed["items"] = typed


def _amend_completions(body: dict[str, Any], chat: Route) -> None:
    """/v1/chat/completions' ``configurable`` as /chat's without the domain (``model``
    names it), each domain allowing only its own prompts' versions."""
    configurable = chat.config_schema(REF_TEMPLATE)["properties"]["configurable"]
    configurable.pop("allOf", None)
    configurable["properties"].pop(DOMAIN_KEY, None)
    body["properties"]["configurable"] = configurable
    body["anyOf"] = [
        {
            "properties": {
                "model": domain["properties"].pop(DOMAIN_KEY),
                "configurable": domain,
            }
        }
        for domain in chat.domain_versions()
    ]


def _amend_runs(document: dict[str, Any], run_request: type[BaseModel], chat: Route) -> None:
    """The threads API's runs: their body (which the route reads itself, within the
    server's limits), whose ``config.configurable`` is /chat's, with its bounds and each
    domain's prompt versions; a streamed run's reply as events; the model's failures."""
    schemas = document["components"]["schemas"]
    _add_models(schemas, run_request)
    config = chat.config_schema(REF_TEMPLATE)
    for nested, schema in config.pop("$defs", {}).items():
        schemas.setdefault(nested, schema)
    schemas["RunConfig"]["properties"]["configurable"] = config["properties"]["configurable"]
    for path, methods in document["paths"].items():
        if not path.startswith("/threads/") or not path.endswith(("/runs/stream", "/runs/wait")):
            continue
        operation = methods["post"]
        operation["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {
                    "schema": _ref(run_request.__name__),
                    "example": {
                        "assistant_id": "chat",
                        "input": {"messages": [{"role": "user", **_EXAMPLE_QUESTION}]},
                    },
                }
            },
        }
        _declare(operation["responses"], (*MODEL_FAILURES, 503), _ref("Problem"), {})
        if path.endswith("/stream"):
            operation["responses"]["200"]["content"] = copy.deepcopy(EVENT_STREAM)


_EXAMPLE_QUESTION = {"content": "What does the standard plan cost?"}


def _amend(
    document: dict[str, Any], chat_request: type[BaseModel], models: list[str], keyed: bool
) -> None:
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for name in _FASTAPI_422:
        schemas.pop(name, None)
    schemas["Problem"] = copy.deepcopy(PROBLEM)
    schemas["OpenAIError"] = copy.deepcopy(OPENAI_ERROR)
    for name, schema in schemas.items():
        if name.endswith(_ENVELOPES):  # check_body refuses other keys (LangServe ignores them)
            schema["additionalProperties"] = False
    _add_models(schemas, chat_request)
    schemas[chat_request.__name__]["properties"]["model"]["enum"] = models
    if keyed:
        document["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"},
            "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
        }
    paths = document["paths"]
    for path in list(paths):
        # The playground's share links (/c/{config_hash}/...) are for the playground alone.
        if "/c/{config_hash}/" in path:
            del paths[path]
            continue
        for method, operation in paths[path].items():
            _amend_operation(path, method.upper(), operation, chat_request, models, keyed)
    _binary_parts(document)


def _amend_operation(
    path: str,
    method: str,
    operation: dict[str, Any],
    chat_request: type[BaseModel],
    models: list[str],
    keyed: bool,
) -> None:
    endpoint = path.rsplit("/", 1)[-1]
    route = path.strip("/").split("/")[0]
    # LangServe's stand-in handlers take a config_hash argument the real ones never read.
    parameters = [p for p in operation.get("parameters", []) if p.get("name") != "config_hash"]
    if parameters:
        operation["parameters"] = parameters
    else:
        operation.pop("parameters", None)
    responses = operation.setdefault("responses", {})
    problem = _ref("OpenAIError" if path.startswith(OPENAI_PREFIX) else "Problem")
    body = operation.get("requestBody", {}).get("content", {})
    meanings = MULTIPART_MEANING if MULTIPART in body else {}
    statuses: list[int] = []
    if method == "POST" or body:
        statuses += BODY_CHECKS
    if endpoint in RUNNING or path == f"{OPENAI_PREFIX}chat/completions":
        statuses.append(503)  # the store or the index
        if route not in MODEL_FREE:
            statuses += MODEL_FAILURES
    if path == "/feedback":
        statuses.append(503)  # the feedback store cannot be written
    if path.startswith(COLLECTION_PREFIX):
        statuses.append(503)  # the store or the index
    if keyed and not is_open(path):
        statuses.append(401)
        operation["security"] = [{"bearer": []}, {"apiKey": []}]
    # FastAPI's 422 (a parameter's or a form's) is the server's Problem (server.invalid_input).
    if _ref(_FASTAPI_422[0]) == _schema_of(responses.get("422")):
        del responses["422"]
        statuses.append(422)
    _declare(responses, statuses, problem, meanings)
    _amend_documents(operation, responses)
    if path == "/readyz":  # not ready: the same report, saying what is not
        responses["503"] = {"description": "Not ready", "content": responses["200"]["content"]}
    if endpoint in STREAMING:
        responses["200"]["content"] = copy.deepcopy(EVENT_STREAM)
    example = EXAMPLE_INPUTS.get(route)
    if example is not None and endpoint in RUNNING:
        body = {"inputs": [example]} if endpoint == "batch" else {"input": example}
        operation["requestBody"]["content"]["application/json"]["example"] = body
    if path == f"{OPENAI_PREFIX}chat/completions":
        question = {"role": "user", "content": EXAMPLE_INPUTS["chat"]["question"]}
        operation["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {
                    "schema": _ref(chat_request.__name__),
                    "example": {"model": DEFAULT_DOMAIN, "messages": [question]},
                }
            },
        }
        responses["200"]["content"] = {
            "application/json": {"schema": {"type": "object"}},
            **copy.deepcopy(EVENT_STREAM),
        }


def _declare(
    responses: dict[str, Any],
    statuses: Iterable[int],
    problem: dict[str, str],
    meanings: Mapping[int, str],
) -> None:
    """Each of ``statuses`` answered with ``problem``, described in ``meanings``' words
    (else MEANING's), after the route's own description when it declares the status."""
    for status in sorted(set(statuses)):
        meaning = meanings.get(status, MEANING[status])
        own = responses.get(str(status), {}).get("description")
        responses[str(status)] = {
            "description": f"{own}; or: {meaning[0].lower()}{meaning[1:]}"
            if own and own != meaning
            else meaning,
            "content": {"application/json": {"schema": problem}},
        }


def _amend_documents(operation: dict[str, Any], responses: dict[str, Any]) -> None:
    """The documents API as it is called and answers: a document's path is one parameter,
    its slashes included; a job accepted (202) with its URL in Location; a job's events as
    ``text/event-stream`` only."""
    for parameter in operation.get("parameters", []):
        if parameter.get("in") == "path" and parameter.get("name") == "path":
            parameter["description"] = DOCUMENT_PATH
            parameter["example"] = DOCUMENT_PATH_EXAMPLE
    accepted = responses.get("202")
    if accepted is not None and _schema_of(accepted) == _ref("JobAccepted"):
        accepted["headers"] = copy.deepcopy(JOB_LOCATION)
    content = responses.get("200", {}).get("content", {})
    if "text/event-stream" in content:  # FastAPI adds its default JSON beside it
        responses["200"]["content"] = copy.deepcopy(EVENT_STREAM)


def _binary_parts(document: dict[str, Any]) -> None:
    """Multipart bodies' files as OpenAPI's binary strings (clients and fuzzers send those
    as files), and a required list of files with at least one (an empty list is no part)."""
    schemas = document["components"]["schemas"]
    for methods in document["paths"].values():
        for operation in methods.values():
            content = operation.get("requestBody", {}).get("content", {}).get(MULTIPART)
            ref = (content or {}).get("schema", {}).get("$ref", "")
            body = schemas.get(ref.rsplit("/", 1)[-1])
            if body is None:
                continue
            required = set(body.get("required", ()))
            for name, part in body.get("properties", {}).items():
                if _is_file(part):
                    _as_binary(part)
                elif part.get("type") == "array" and _is_file(part.get("items", {})):
                    _as_binary(part["items"])
                    if name in required:
                        part["minItems"] = max(1, part.get("minItems", 1))


def _is_file(schema: Mapping[str, Any]) -> bool:
    return schema.get("type") == "string" and (
        schema.get("format") == "binary"
        or schema.get("contentMediaType") == "application/octet-stream"
    )


def _as_binary(schema: dict[str, Any]) -> None:
    schema.pop("contentMediaType", None)
    schema["format"] = "binary"


def _schema_of(response: Mapping[str, Any] | None) -> Any:
    return ((response or {}).get("content") or {}).get("application/json", {}).get("schema")


def _add_models(schemas: dict[str, Any], model: type[BaseModel]) -> None:
    """``model``'s JSON schema, and the models it uses, among the document's schemas."""
    schema = model.model_json_schema(ref_template=REF_TEMPLATE)
    for name, nested in schema.pop("$defs", {}).items():
        schemas.setdefault(name, nested)
    schemas[model.__name__] = schema


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}
