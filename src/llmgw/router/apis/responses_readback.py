"""Reading back a natively served Responses stream that broke off.

`read_items` recovers the output items a client received (reasoning, message,
function call: their ids, text or arguments, and how far each got) from the
events relayed to it, for `responses.resume_stream` to continue it through the
translation. `StreamItem` is the item the translation writes, shared by both.

Not guaranteed: items of kinds other than those three, or out of the order an
answer can be written back in (one thought, then text, then calls), are not read
(None: the stream is not continued).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import orjson

from llmgw.router.apis.relay import loads
from llmgw.router.apis.sse_events import SSEEvents


def _id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


class StreamItem:
    """An output item of a Responses stream while it is written: its kind, ids, place
    and text (or arguments) so far; for a function call, the chat index of its call
    (`tool`)."""

    __slots__ = ("call_id", "id", "kind", "name", "output_index", "text", "tool")

    def __init__(self, kind: str, output_index: int, tool: int = -1) -> None:
        self.kind = kind
        self.id = _id({"message": "msg_", "reasoning": "rs_", "function_call": "fc_"}[kind])
        self.output_index = output_index
        self.tool = tool
        self.text = ""
        self.call_id = ""
        self.name = ""


ITEM_KINDS = ("reasoning", "message", "function_call")
# Each item kind's delta event, and the part its content_part.added opens (if any).
_ITEM_DELTAS = {
    "reasoning": "response.reasoning_text.delta",
    "message": "response.output_text.delta",
    "function_call": "response.function_call_arguments.delta",
}
_ITEM_PARTS = {"reasoning": "reasoning_text", "message": "output_text"}
# Events that only repeat what the deltas said, before an item's output_item.done.
_ITEM_ENDS = (
    "response.reasoning_text.done",
    "response.output_text.done",
    "response.function_call_arguments.done",
    "response.content_part.done",
)


@dataclass(slots=True)
class ReadBack:
    """A broken stream as read back: its items, last event number, response id and
    creation time."""

    items: list[ReadItem]
    seq: int
    id: str
    created_at: int | None


class ReadItem:
    """An output item of a broken stream, as the client received it."""

    __slots__ = ("done", "ending", "item", "part", "parts")

    def __init__(self, item: StreamItem) -> None:
        self.item = item
        self.parts: list[str] = []
        self.part = False
        # Its text or arguments were declared done (`.done` events): nothing may follow.
        self.ending = False
        self.done: dict[str, Any] | None = None


def read_items(sent: bytes) -> ReadBack | None:
    """The output items of a broken Responses stream, its response's id and creation
    time and its last event number; None when it cannot be continued."""
    created = False
    items: list[ReadItem] = []
    seq = -1
    ident, created_at = "", None
    for name, data in SSEEvents().feed(sent):
        if name == "comment":
            continue
        event = loads(data)
        if event is None:
            return None
        number = event.get("sequence_number")
        if isinstance(number, int) and not isinstance(number, bool):
            seq = max(seq, number)
        kind = event.get("type")
        last = items[-1] if items else None
        open_item = last if last is not None and last.done is None else None
        if kind == "response.created" and not created:
            response = event.get("response") or {}
            if not isinstance(response, dict) or not isinstance(response.get("id"), str):
                return None
            created = True
            ident = response["id"]
            if isinstance(response.get("created_at"), int):
                created_at = response["created_at"]
        elif kind == "response.in_progress" and created:
            continue
        elif kind == "response.output_item.added" and created and open_item is None:
            read = _added_item(event, items)
            if read is None:
                return None
            items.append(read)
        elif open_item is not None and event.get("item_id") == open_item.item.id:
            if not _item_event(open_item, kind, event):
                return None
        elif (
            kind == "response.output_item.done"
            and open_item is not None
            and isinstance(event.get("item"), dict)
            and event["item"].get("id") == open_item.item.id
        ):
            open_item.done = event["item"]
        else:
            return None
    return ReadBack(items, seq, ident, created_at) if created else None


def _added_item(event: dict[str, Any], items: list[ReadItem]) -> ReadItem | None:
    """The item an `output_item.added` opens, when it may follow `items` in an answer
    llmgw can write back (one thought first, then text, then calls)."""
    added = event.get("item") or {}
    if not isinstance(added, dict) or not isinstance(added.get("id"), str):
        return None
    kind = added.get("type")
    if kind not in ITEM_KINDS or event.get("output_index") != len(items):
        return None
    kinds = [r.item.kind for r in items]
    if (kind == "reasoning" and kinds) or (
        kind == "message" and ("message" in kinds or "function_call" in kinds)
    ):
        return None
    calls = kinds.count("function_call")
    item = StreamItem(str(kind), len(items), calls if kind == "function_call" else -1)
    item.id = added["id"]
    if kind == "function_call":
        call_id, name = added.get("call_id"), added.get("name")
        if not isinstance(call_id, str) or not isinstance(name, str) or not name:
            return None
        item.call_id, item.name = call_id, name
    read = ReadItem(item)
    read.part = kind == "function_call"
    return read


def _item_event(read: ReadItem, kind: Any, event: dict[str, Any]) -> bool:
    """Take an event of the open item `read`; False when it is not understood."""
    item = read.item
    if kind == "response.content_part.added" and not read.part:
        part = event.get("part") or {}
        read.part = isinstance(part, dict) and part.get("type") == _ITEM_PARTS.get(item.kind)
        return read.part and event.get("content_index", 0) == 0
    if kind == _ITEM_DELTAS[item.kind] and read.part and not read.ending:
        piece = event.get("delta")
        if not isinstance(piece, str):
            return False
        if piece:
            read.parts.append(piece)
            item.text += piece
        return True
    read.ending = kind in _ITEM_ENDS
    return read.ending


def complete(arguments: str) -> bool:
    try:
        return isinstance(orjson.loads(arguments), dict)
    except orjson.JSONDecodeError:
        return False
