"""The end user a request names: OpenAI's `user` (chat, completions, embeddings,
Responses) and Anthropic's `metadata.user_id`, which the Messages and Responses
adapters carry over into the chat body's `user`.

An end user is someone using the application that holds the key; the key's
end-user limits (`Principal.end_user_limits`) are counted per (key, end user) and
usage records keep it. The value is whatever the client sends, so it is made safe
once, here: non-printable characters are escaped (`\\x00`, `\\u200b`) so that the
store, logs and terminals get printable text, and a value longer than
MAX_END_USER_CHARS (escapes counted) is refused with a 400 naming the field rather
than cut, so two long end users never share one name.

Not guaranteed: that two end users stay apart when one's name is the escaped form of
the other's (`"a\\x00"` sent as those four characters and `"a"` with a NUL); both
come from the same key's application.
"""

from __future__ import annotations

from typing import Any

from llmgw.router.errors import InvalidRequest
from llmgw.store import MAX_END_USER_CHARS


def _escaped(value: str) -> str:
    return "".join(
        c if c.isprintable() else (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
        for c in value
    )


def end_user_of(body: Any) -> str:
    """The end user the request body names, printable; "" when it names none (no `user`,
    an empty one, or a body that is no JSON object, as multipart engine routes send).
    InvalidRequest (400, param `user`) when it is too long."""
    if not isinstance(body, dict):
        return ""
    value = body.get("user")
    if not isinstance(value, str) or not value:
        return ""
    if len(value) > MAX_END_USER_CHARS:
        raise _too_long(len(value))
    if value.isprintable():
        return value
    shown = _escaped(value)
    if len(shown) > MAX_END_USER_CHARS:
        raise _too_long(len(shown), escaped=True)
    return shown


def _too_long(length: int, *, escaped: bool = False) -> InvalidRequest:
    how = " once its non-printable characters are escaped" if escaped else ""
    return InvalidRequest(
        f"'user' (the end user; metadata.user_id in the Messages API) is {length} characters "
        f"long{how}; an end user has at most {MAX_END_USER_CHARS}: send a shorter id, e.g. a "
        "hash of the user's name",
        param="user",
    )
