"""Helpers for the long-lived loops every llmgw process runs.

Not guaranteed: restarting a loop; a loop that ends unexpectedly ends its task
group, and the process decides what to do.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

log = logging.getLogger("llmgw")


async def wait_for_event(event: asyncio.Event, seconds: float) -> bool:
    """Wait until `event` is set or `seconds` pass; True when it was set."""
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def guard(name: str, coro: Awaitable[None]) -> None:
    """Log a background loop's unexpected end with its exception, then re-raise."""
    try:
        await coro
    except asyncio.CancelledError:
        raise
    except BaseException:
        log.exception("%s stopped unexpectedly", name)
        raise
    else:
        log.debug("%s finished", name)
