"""The rules of text a request types (a question, a history message, the question of a vote):
checked and published as one, so the API's document states what the server checks.

Nothing here imports a web framework: the request models of the server and of the feedback
store both use it.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field

# Characters no typed text holds (tab and line breaks aside): a NUL-only question is not one.
CONTROL = r"\x00-\x08\x0b\x0c\x0e-\x1f\x7f"
CONTROL_CHARACTERS = re.compile(f"[{CONTROL}]")
# Text that says something: no control character and one character at least that is not
# whitespace. Each text field publishes the pattern it is checked with (its JSON Schema
# ``pattern``), so the API's document and the server cannot disagree about it.
SAYS_SOMETHING = rf"^[^{CONTROL}]*[^\s{CONTROL}][^{CONTROL}]*$"
PLAIN_TEXT = rf"^[^{CONTROL}]*$"
# What SAYS_SOMETHING asks of text without control characters.
_NOT_BLANK = re.compile(r"\S")


def text_type(what: str, max_chars: int, *, blank: bool = False) -> Any:
    """A text field's type: at most ``max_chars`` characters, no control characters and (unless
    ``blank``) not empty; published with the bounds and the pattern it is checked with, each
    problem a sentence naming ``what``."""

    def check(text: str) -> str:
        if CONTROL_CHARACTERS.search(text):
            raise ValueError(f"the {what} holds control characters (such as NUL)")
        if len(text) > max_chars:
            raise ValueError(f"the {what} has {len(text)} characters; the limit is {max_chars}")
        if not blank and not _NOT_BLANK.search(text):
            raise ValueError(f"the {what} is empty")
        return text

    published: dict[str, Any] = {
        "maxLength": max_chars,
        "pattern": PLAIN_TEXT if blank else SAYS_SOMETHING,
    }
    return Annotated[
        str,
        Field(min_length=0 if blank else 1, json_schema_extra=published),
        AfterValidator(check),
    ]


def _json_integer(value: Any) -> Any:
    # JSON Schema's integer: 3 and 3.0 alike; never a boolean or a numeral in a string.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("should be a whole number")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("should be a whole number")
        return int(value)
    return value


def json_int(*, ge: int, le: int) -> Any:
    """A whole number from ``ge`` to ``le`` as JSON Schema's "integer" reads it (see
    ``_json_integer``), for request bodies: pydantic's int takes "3" and true, its strict int
    refuses 3.0. (The bounds come first: after the validator they would not be published.)"""
    return Annotated[int, Field(ge=ge, le=le), BeforeValidator(_json_integer)]
