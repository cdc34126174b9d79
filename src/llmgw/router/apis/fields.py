"""Checking the type of one field of a client's body, and the error that names it.

Shared by the API translators; field paths are dotted (`messages.2.content.0.text`).
"""

from __future__ import annotations

from typing import Any

from llmgw.router.errors import InvalidRequest


def kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def field_error(field: str, wanted: str, value: Any) -> InvalidRequest:
    return InvalidRequest(f"{field}: must be {wanted}, got {kind_of(value)}", param=field)


def number_field(body: dict[str, Any], field: str) -> float | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise field_error(field, "a number", value)
    return value
