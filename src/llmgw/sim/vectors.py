"""Deterministic embedding vectors: a unit vector per input, from a hash of the input.

The same input bytes give the same vector on every run and machine (SHAKE-256 expands
the input into `dim` little-endian 16-bit values, centred and normalised).

Not guaranteed: any semantic meaning; similar texts do not get similar vectors.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct


def unit_vector(key: bytes, dim: int) -> list[float]:
    raw = hashlib.shake_256(key).digest(2 * dim)
    values = [value - 32767.5 for value in struct.unpack(f"<{dim}H", raw)]
    norm = math.sqrt(math.fsum(value * value for value in values))
    return [value / norm for value in values]


def to_base64(vector: list[float]) -> str:
    """OpenAI's `encoding_format: "base64"`: little-endian float32 bytes, base64-encoded."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
