"""Parsing and checking client requests before anything is sent upstream.

Only the fields the router acts on, and the common fields whose wrong type an
engine would answer with a less helpful error, are checked here; value ranges
are the engine's to judge. The `model` is checked on every API the same way
(`check_model`: a string of 1 to 256 printable characters), because it is
routed by, counted in metrics and written to the usage store: a name the store
could not hold would cost other requests their usage records. Non-streaming
bodies are forwarded byte for byte; streaming bodies are re-serialized once, to
ask the engine for usage.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from llmgw.limits import estimate_prompt_tokens
from llmgw.router.errors import InvalidJSON, InvalidRequest
from llmgw.store import MAX_MODEL_CHARS

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"

# field -> (accepted types, readable type name)
_INT = (int,)
_NUMBER = (int, float)
_TYPED_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "max_tokens": (_INT, "an integer"),
    "max_completion_tokens": (_INT, "an integer"),
    "n": (_INT, "an integer"),
    "temperature": (_NUMBER, "a number"),
    "top_p": (_NUMBER, "a number"),
    "presence_penalty": (_NUMBER, "a number"),
    "frequency_penalty": (_NUMBER, "a number"),
    "seed": (_INT, "an integer"),
    "user": ((str,), "a string"),
}
# path -> (required field, accepted types, readable type name)
_REQUIRED: dict[str, tuple[str, tuple[type, ...], str]] = {
    CHAT: ("messages", (list,), "an array of messages"),
    COMPLETIONS: ("prompt", (str, list), "a string or an array"),
    EMBEDDINGS: ("input", (str, list), "a string or an array"),
}


_Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


@dataclass(slots=True)
class Resumable:
    """A natively served stream that broke off, as read back for a continuation:
    the answer's text so far and its text deltas (`tokens`), and `wrap`, which
    makes of the client's `send` one that turns the continuation's chat completion
    events into the API's own events, going on from where the engine stopped.
    `reasoning`: the thought so far; `calls`: the tool calls so far (id, name,
    arguments), in order."""

    text: str
    tokens: int
    wrap: Callable[[_Send], _Send]
    reasoning: str = ""
    calls: tuple[tuple[str, str, str], ...] = ()


@dataclass(slots=True)
class NativeRequest:
    """A client's body in another API (`api`: "messages" or "responses"), kept as
    sent for engines that serve that API natively at `path`.

    `required` is why a translation cannot carry the body (e.g. a Responses
    `previous_response_id`): such a request goes only to engines that serve the
    API natively, and is refused with that error when the model has none.
    """

    api: str
    path: str
    body: bytes
    required: InvalidRequest | None = None
    # Reads back what a broken native stream sent (whole events); None when the
    # answer cannot be continued (see `llmgw.router.continuation`).
    resume: Callable[[bytes], Resumable | None] | None = None


@dataclass(slots=True)
class ParsedRequest:
    path: str
    model: str
    stream: bool
    client_wants_usage: bool
    upstream_body: bytes
    body: dict[str, Any]
    _prompt_estimate: int = -1
    # The client's request headers and key, for routing (session, explain header).
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    key_id: str | None = None
    # Whether the key may see the routing explanation (`x-llmgw-route`): an admin
    # key, a key with the `debug` scope, or anyone in open mode.
    may_debug: bool = False
    # Sent upstream as the body's content type (a multipart body keeps its boundary).
    content_type: bytes = b"application/json"
    # The client's own body, for engines serving its API natively; and whether
    # the attempt under way sends it (set by the proxy per attempt).
    native: NativeRequest | None = None
    served_natively: bool = False
    # The end user the request names (`llmgw.router.end_users`); "" for none.
    end_user: str = ""

    def body_for(self, engine_path: str) -> bytes:
        """The body to send to an engine at `engine_path` (the same, unless an engine
        route's engine names a field otherwise)."""
        return self.upstream_body

    def send_as(self, engine_model: str) -> None:
        """Send the request upstream under `engine_model` (the name an alias stands for)."""
        self.body["model"] = engine_model
        self.upstream_body = orjson.dumps(self.body)
        native = self.native
        if native is not None:
            # Only an alias costs the native body a re-serialization.
            client = orjson.loads(native.body)
            client["model"] = engine_model
            native.body = orjson.dumps(client)

    def prompt_tokens_estimate(self) -> int:
        """Prompt tokens estimated from the text (computed once, on first use)."""
        if self._prompt_estimate < 0:
            self._prompt_estimate = estimate_prompt_tokens(self.body)
        return self._prompt_estimate


def _type_name(value: Any) -> str:
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


def _check_type(body: dict[str, Any], field: str, types: tuple[type, ...], name: str) -> None:
    value = body.get(field)
    if value is None:
        return
    # bool is an int in Python, never in JSON.
    if isinstance(value, bool) or not isinstance(value, types):
        raise InvalidRequest(f"'{field}' must be {name}, got {_type_name(value)}", param=field)


class InvalidModel(InvalidRequest):
    """The body's `model` is no model name (too long, not printable, not a string)."""


def model_problem(value: object) -> str | None:
    """Why `value` cannot be a model name, as the end of a sentence; None when it can."""
    if not isinstance(value, str) or not value:
        return f"must be a non-empty string, got {_type_name(value)}"
    if len(value) > MAX_MODEL_CHARS:
        return (
            f"is {len(value)} characters long; a model name has at most {MAX_MODEL_CHARS} "
            "(GET /v1/models lists the models)"
        )
    if not value.isprintable():
        at, char = next((i, c) for i, c in enumerate(value) if not c.isprintable())
        return (
            f"contains the non-printable character U+{ord(char):04X} at position {at}; "
            "a model name is printable text (GET /v1/models lists the models)"
        )
    return None


def check_model(value: object, label: str = "'model'") -> str:
    """`value` if it can be a model name; InvalidModel (400, param `model`) saying why
    not, its message starting with `label` ("'model'", or "model:" in the Anthropic
    and Responses APIs' style)."""
    problem = model_problem(value)
    if problem is not None:
        raise InvalidModel(f"{label} {problem}", param="model")
    assert isinstance(value, str)
    return value


def clean_model_name(name: str) -> str:
    """A model name as sent, fit for a usage record and a log line: non-printable
    characters escaped (`\\x00`, `\\u200b`), cut to MAX_MODEL_CHARS (ending in "...")."""
    if len(name) <= MAX_MODEL_CHARS and name.isprintable():
        return name
    shown = "".join(
        c if c.isprintable() else (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
        for c in name[: MAX_MODEL_CHARS + 1]
    )
    if len(shown) > MAX_MODEL_CHARS or len(name) > MAX_MODEL_CHARS:
        shown = shown[: MAX_MODEL_CHARS - 3] + "..."
    return shown


def named_model(raw: bytes) -> str | None:
    """The model a (possibly invalid) body names, cleaned (`clean_model_name`); None
    when it names none. For recording a refused request, not for routing."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    model = body.get("model") if isinstance(body, dict) else None
    return clean_model_name(model) if isinstance(model, str) and model else None


def parse_request(path: str, raw: bytes) -> ParsedRequest:
    """Check a request body for `path`; raise InvalidRequest naming the field."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSON(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidRequest(f"request body must be a JSON object, got {_type_name(body)}")
    model = body.get("model")
    if model is None:
        raise InvalidRequest("you must provide a 'model' parameter", param="model")
    model = check_model(model)
    field, types, name = _REQUIRED[path]
    if field not in body:
        raise InvalidRequest(f"you must provide a '{field}' parameter", param=field)
    if not isinstance(body[field], types):
        raise InvalidRequest(
            f"'{field}' must be {name}, got {_type_name(body[field])}", param=field
        )
    for typed_field, (accepted, type_name) in _TYPED_FIELDS.items():
        if typed_field in body:
            _check_type(body, typed_field, accepted, type_name)

    stream = body.get("stream")
    if stream is None:
        stream = False
    elif not isinstance(stream, bool):
        raise InvalidRequest(
            f"'stream' must be a boolean, got {_type_name(stream)}", param="stream"
        )
    if stream and path == EMBEDDINGS:
        raise InvalidRequest("embeddings cannot be streamed", param="stream")

    options = body.get("stream_options")
    wants_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise InvalidRequest(
                f"'stream_options' must be an object, got {_type_name(options)}",
                param="stream_options",
            )
        include = options.get("include_usage")
        if include is not None and not isinstance(include, bool):
            raise InvalidRequest(
                f"'stream_options.include_usage' must be a boolean, got {_type_name(include)}",
                param="stream_options.include_usage",
            )
        wants_usage = bool(include)

    if stream and not wants_usage:
        # Ask the engine for the usage chunk; the relay removes it again.
        body["stream_options"] = {**(options or {}), "include_usage": True}
        raw = orjson.dumps(body)
    return ParsedRequest(path, model, stream, wants_usage, raw, body)
