"""What the rewriter offers a model and how it reads what comes back: the tools
(``search_sources``, ``search_by_filename``, ``add_filter`` over the index's own fields), the
GBNF grammars that hold a model without tool calling to the same call syntax (and to N lines
of phrasings), and the parsing of calls and queries written as text, sanitised so that junk
never becomes a search.
"""

import ast
import json
import re
from collections.abc import Mapping
from typing import Any

from ragchains.retrievers.filters import OPERATORS
from ragchains.retrievers.formats import format_names

SEARCH_TOOL = "search_sources"


FILENAME_TOOL = "search_by_filename"


FILTER_TOOL = "add_filter"


# Replies that mean "no query": small models produce these instead of calling a tool.
_EMPTY_REPLIES = frozenset({"", "0", "empty string", "none", "null", "n/a", "no query", '""', "''"})


_QUOTES = "\"'`“”‘’"


_CALL = re.compile(r"(search_sources|search_by_filename|add_filter)\s*\((.*?)\)\s*(?:;|$)", re.S)


MAX_QUERY_CHARS = 400


# A reply longer than this, or one with citation markers, is an answer, not a query.
MAX_PROSE_QUERY_WORDS = 16


_CITATION_LIKE = re.compile(r"\[[^\]\s]+[#.][^\]]*\]")


_LIST_MARK = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+")


def sanitize_query(raw: Any) -> str | None:
    """A usable search query from whatever the model produced, or None."""
    if not isinstance(raw, str):
        return None
    text = raw.strip()
    # Strip matched quotes, repeatedly: '"\'query\'"' happens.
    while len(text) >= 2 and text[0] in _QUOTES and text[-1] in _QUOTES:
        text = text[1:-1].strip()
    if text.lower().rstrip(".") in _EMPTY_REPLIES:
        return None
    if text.startswith(("{", "[")):
        return None  # JSON where a query belongs: the model misread the protocol
    text = " ".join(text.split())
    return text[:MAX_QUERY_CHARS] or None


# The values a filter on ``format`` can match (what ingest writes, ``retrievers.formats``):
# told to the model so that it filters on "pdf", not on "PDF files".
FORMAT_FIELD = "format"


def _formats() -> str:
    return ", ".join(format_names())


def describe_fields(fields: Mapping[str, str]) -> str:
    return ", ".join(f"{name} ({kind})" for name, kind in sorted(fields.items()))


def build_tools(fields: Mapping[str, str]) -> list[dict[str, Any]]:
    """OpenAI-style tool schemas; ``add_filter`` only admits the index's own fields (and is
    left out when there are none)."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": SEARCH_TOOL,
                "description": "Search the documents with one standalone query.",
                "parameters": {
                    "type": "object",
                    "properties": {"search_query": {"type": "string"}},
                    "required": ["search_query"],
                },
            },
        },
        {
            "type": "function",
            "function": {
                "name": FILENAME_TOOL,
                "description": "Search only in the file with this name (globs like *.pdf work).",
                "parameters": {
                    "type": "object",
                    "properties": {"filename": {"type": "string"}},
                    "required": ["filename"],
                },
            },
        },
    ]
    if not fields:
        return tools
    described = "Keep only chunks whose metadata field satisfies a condition."
    if FORMAT_FIELD in fields:
        described += f" A file's {FORMAT_FIELD} is one of: {_formats()}."
    filter_tool = {
        "type": "function",
        "function": {
            "name": FILTER_TOOL,
            "description": described,
            "parameters": {
                "type": "object",
                "properties": {
                    "field": {"type": "string", "enum": sorted(fields)},
                    "op": {"type": "string", "enum": list(OPERATORS)},
                    "value": {
                        "anyOf": [
                            {"type": "number"},
                            {"type": "string"},
                            {"type": "boolean"},
                            {"type": "array", "items": {"type": ["number", "string"]}},
                        ]
                    },
                },
                "required": ["field", "op", "value"],
            },
        },
    }
    return [*tools, filter_tool]


_GBNF_TEXT = r"[^'\\\n] [^'\\\n]"


def call_grammar(fields: Mapping[str, str]) -> str:
    """GBNF for the plain-text call syntax: one search or file lookup, then up to three
    filters on the index's own fields with known operators."""
    rules = [
        'root ::= lookup (";" " " filter){0,3}' if fields else "root ::= lookup",
        'lookup ::= "search_sources(search_query=\'" text "\')" '
        '| "search_by_filename(filename=\'" text "\')"',
        f"text ::= {_GBNF_TEXT}{{0,149}}",
    ]
    if fields:
        rules += [
            'filter ::= "add_filter(field=\'" field "\', op=\'" op "\', value=" value ")"',
            "field ::= " + " | ".join(json.dumps(name) for name in sorted(fields)),
            "op ::= " + " | ".join(json.dumps(op) for op in OPERATORS),
            'value ::= item | "True" | "False" | "[" item (", " item){0,7} "]"',
            "item ::= number | string",
            'number ::= "-"? [0-9] [0-9]{0,8} ("." [0-9]{1,4})?',
            f'string ::= "\'" {_GBNF_TEXT}{{0,59}} "\'"',
        ]
    return "\n".join(rules) + "\n"


def lines_grammar(count: int) -> str:
    """GBNF for exactly ``count`` non-empty lines (multi-query phrasings, a re-query)."""
    more = f' ("\\n" line){{{count - 1}}}' if count > 1 else ""
    return f"root ::= line{more}\nline ::= [^\\n] [^\\n]{{0,149}}\n"


def text_calls(text: str) -> list[dict[str, Any]]:
    """Tool calls written as text, e.g. ``search_sources(search_query='x'); add_filter(...)``."""
    calls = []
    for name, raw_args in _CALL.findall(text):
        args: dict[str, Any] = {}
        try:
            tree = ast.parse(f"f({raw_args})", mode="eval")
            call = tree.body
            assert isinstance(call, ast.Call)
            for kw in call.keywords:
                if kw.arg is not None:
                    args[kw.arg] = ast.literal_eval(kw.value)
            if call.args and not args:  # search_sources('x')
                key = {SEARCH_TOOL: "search_query", FILENAME_TOOL: "filename"}.get(name)
                if key:
                    args[key] = ast.literal_eval(call.args[0])
        except (SyntaxError, ValueError, AssertionError):
            calls.append(
                {"name": name, "args": None, "error": f"unparsable arguments {raw_args!r}"}
            )
            continue
        calls.append({"name": name, "args": args})
    return calls


def prose_query(text: str) -> str | None:
    """A bare query written as text; a long or cited reply is an answer, not a query."""
    first = text.strip().splitlines()[0]
    if len(first.split()) > MAX_PROSE_QUERY_WORDS or _CITATION_LIKE.search(first):
        return None
    return sanitize_query(first)


def parse_alternatives(text: str, *, main: str, count: int) -> list[str]:
    """Up to ``count`` distinct phrasings, one per line, list marks removed."""
    seen = {main.casefold()}
    found = []
    for line in text.splitlines():
        query = sanitize_query(_LIST_MARK.sub("", line))
        if query and query.casefold() not in seen:
            seen.add(query.casefold())
            found.append(query)
    return found[:count]
