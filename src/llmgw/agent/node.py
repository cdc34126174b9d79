"""The agent process's lifecycle: its background loops in one TaskGroup, and shutdown.

`run_node` starts the supervisor, adopts the engines an earlier agent left
running (so the first Register reports them), then runs the connection as a
guarded task until `stop` is set, and shuts down in a fixed order:

1. the supervisor refuses new shards and, with `stop_engines`, stops every
   engine (drain_grace for in-flight requests, then SIGTERM and SIGKILL to the
   group) while the stream is still up; without it, engines are left running
   for the next agent to adopt, and nothing is reported (a clean agent stop is
   not a replica failure);
2. the connection sends what it still has queued (a few seconds at most), so
   the control plane sees each stopped shard, then it is cancelled and its
   channel closed;
3. the supervisor's loop ends.

If a loop dies unexpectedly, the guard logs it and the TaskGroup cancels the
rest; engines keep running and the next agent adopts them.

Not guaranteed: that engines finish in-flight requests when stopped (their
drain_grace is all they get).
"""

from __future__ import annotations

import asyncio
import logging

from llmgw.agent.connection import Connection
from llmgw.agent.supervisor import Supervisor
from llmgw.lifecycle import guard

log = logging.getLogger("llmgw.agent")

# The last shard reports are small; a stream that cannot take them in this long is stuck.
FLUSH_SECONDS = 3.0


async def run_node(
    *,
    supervisor: Supervisor,
    connection: Connection,
    stop: asyncio.Event,
    grace_seconds: float,
    stop_engines: bool,
) -> None:
    """Serve until `stop` is set, then stop every engine (or leave them) and disconnect."""
    async with asyncio.TaskGroup() as group:
        supervising = group.create_task(guard("supervisor", supervisor.run()))
        try:
            await supervisor.adopt()
        except Exception:
            # Not one of the guarded loops: log it here, or it leaves no traceback.
            log.exception("adopting the engines of the state directory failed")
            raise
        connected = group.create_task(guard("connection", connection.run()))
        await stop.wait()
        if stop_engines:
            log.info("shutting down: stopping every engine (grace %gs)", grace_seconds)
        else:
            log.info("shutting down: engines keep running (--stop-engines-on-exit stops them)")
        await supervisor.shutdown(grace=grace_seconds, stop_engines=stop_engines)
        await connection.flush(grace=FLUSH_SECONDS)
        connected.cancel()
        await supervising
    log.info("stopped")
