"""Requests of the engine routes (rerank, score, tokenizer, audio), passed through as bytes.

The router reads only what it routes by: the `model` of a JSON body, or the
`model` part of a multipart/form-data body (audio), found by scanning the body
for the part's headers without parsing or copying the file. The body goes to the
engine as it came, under the client's content type (the multipart boundary
with it); only an alias is rewritten, in place, to the model name engines serve.
Which engines serve a route is the endpoints' business (`llmgw.engines.routes`).

Not guaranteed: the rest of the body is the engine's to judge (vLLM's rerank
wants `query` and `documents`, llama.cpp's tokenizer wants `input` where vLLM's
wants `prompt`); its errors are passed on as it sends them.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from llmgw.engines.routes import ENGINE_ROUTES, MULTIPART_ROUTES, RENAMED_FIELDS
from llmgw.router.errors import InvalidJSON, InvalidRequest
from llmgw.router.requests import InvalidModel, ParsedRequest, check_model
from llmgw.store import MAX_MODEL_CHARS

ROUTES = frozenset(ENGINE_ROUTES)
_MULTIPART = b"multipart/form-data"
# The most bytes a model name of MAX_MODEL_CHARS characters takes in UTF-8: a
# longer `model` part is refused without being decoded.
_MAX_MODEL_BYTES = 4 * MAX_MODEL_CHARS


@dataclass(slots=True)
class MultipartRequest(ParsedRequest):
    """A multipart request; `model_span` is where the model's value lies in the body."""

    model_span: tuple[int, int] = (0, 0)

    def send_as(self, engine_model: str) -> None:
        """Rewrite the `model` part's value in place; every other byte stays as sent."""
        start, end = self.model_span
        raw = self.upstream_body
        self.upstream_body = raw[:start] + engine_model.encode() + raw[end:]
        self.model_span = (start, start + len(engine_model.encode()))
        self.body["model"] = engine_model


@dataclass(slots=True)
class JsonEngineRequest(ParsedRequest):
    """A JSON request of an engine route; fields are renamed for engines that name
    them otherwise (`llmgw.engines.routes.RENAMED_FIELDS`)."""

    def body_for(self, engine_path: str) -> bytes:
        renames = RENAMED_FIELDS.get(engine_path, {})
        # A field the client already names the engine's way is left alone.
        wanted = {
            old: new for old, new in renames.items() if old in self.body and new not in self.body
        }
        if not wanted:
            return self.upstream_body
        return orjson.dumps({wanted.get(k, k): v for k, v in self.body.items()})


def parse(path: str, raw: bytes, content_type: bytes | None) -> ParsedRequest:
    """A request for engine route `path`; InvalidRequest naming the field when the
    body is not what the route takes or names no model."""
    if path in MULTIPART_ROUTES:
        return _parse_multipart(path, raw, content_type or b"")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSON(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    model = body.get("model")
    if model is None:
        raise InvalidRequest(
            f"you must provide a 'model' parameter: {path} is routed by model", param="model"
        )
    return JsonEngineRequest(path, check_model(model), False, False, raw, body)


def _boundary(content_type: bytes) -> bytes:
    kind, _, params = content_type.partition(b";")
    if kind.strip().lower() != _MULTIPART:
        shown = kind.strip().decode("latin-1") or "none"
        raise InvalidRequest(
            f"request body must be multipart/form-data (the audio in a 'file' part and "
            f"the model in a 'model' part), got content type {shown}"
        )
    for param in params.split(b";"):
        name, _, value = param.strip().partition(b"=")
        if name.strip().lower() == b"boundary":
            value = value.strip().strip(b'"')
            if 0 < len(value) <= 70:
                return value
    raise InvalidRequest(
        "multipart/form-data content type has no boundary; let the HTTP client set "
        "the content type of a multipart body"
    )


def _part_name(headers: bytes) -> bytes | None:
    """The `name` of a part's Content-Disposition header; None when it has none."""
    for line in headers.split(b"\r\n"):
        field, _, value = line.partition(b":")
        if field.strip().lower() != b"content-disposition":
            continue
        for param in value.split(b";")[1:]:
            key, _, quoted = param.strip().partition(b"=")
            if key.strip().lower() == b"name":
                return quoted.strip().strip(b'"')
    return None


def _malformed(why: str) -> InvalidRequest:
    return InvalidRequest(f"request body is not valid multipart/form-data: {why}")


def _parse_multipart(path: str, raw: bytes, content_type: bytes) -> ParsedRequest:
    delimiter = b"--" + _boundary(content_type)
    if not raw.startswith(delimiter):
        first = raw.find(b"\r\n" + delimiter)
        if first < 0:
            raise _malformed("the boundary of its content type is not in it")
        pos = first + 2
    else:
        pos = 0
    fields: dict[str, str] = {}
    span: tuple[int, int] | None = None
    closed = False
    while True:
        pos += len(delimiter)
        if raw.startswith(b"--", pos):
            closed = True
            break
        if not raw.startswith(b"\r\n", pos):
            raise _malformed("a boundary is not followed by a line break")
        head_end = raw.find(b"\r\n\r\n", pos + 2)
        if head_end < 0:
            raise _malformed("a part's headers do not end")
        start = head_end + 4
        end = raw.find(b"\r\n" + delimiter, start)
        if end < 0:
            raise _malformed("it does not end with its closing boundary")
        name = _part_name(raw[pos + 2 : head_end])
        if name == b"model" and end - start > _MAX_MODEL_BYTES:
            raise InvalidModel(
                f"'model' is {end - start} bytes long; a model name has at most "
                f"{MAX_MODEL_CHARS} characters",
                param="model",
            )
        if name in (b"model", b"stream") and end - start <= _MAX_MODEL_BYTES:
            text = raw[start:end].decode("utf-8", "replace").strip()
            fields[name.decode()] = text
            if name == b"model":
                span = (start, end)
        pos = end + 2
    if not closed:
        raise _malformed("it does not end with its closing boundary")
    model = fields.get("model")
    if span is None or not model:
        raise InvalidRequest(
            f"you must provide a 'model' parameter (a form field): {path} is routed by model",
            param="model",
        )
    check_model(model)
    stream = fields.get("stream", "").lower() == "true"
    # Never strip the engine's usage from an audio stream: the client asks for it itself.
    return MultipartRequest(
        path,
        model,
        stream,
        True,
        raw,
        {"model": model},
        content_type=content_type,
        model_span=span,
    )
