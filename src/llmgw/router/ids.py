"""Request ids: UUID-shaped (some engines refuse anything else), made cheaply.

`uuid.uuid4()` builds a UUID object per call; a request id only needs the text.
"""

from __future__ import annotations

import os
import re

_UUID = re.compile(rb"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_VARIANT = "89ab"


def new_request_id() -> bytes:
    """A random (version 4) UUID as ASCII bytes."""
    h = os.urandom(16).hex()
    return (
        f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"
    ).encode()


def is_uuid(value: bytes) -> bool:
    return _UUID.fullmatch(value) is not None
