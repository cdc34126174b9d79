"""The agent process's lifecycle: its background loops in one TaskGroup, and shutdown.

`run_node` runs the supervisor and the connection as guarded tasks until `stop`
is set, then shuts down in a fixed order:

1. the supervisor refuses new shards and stops every engine (SIGTERM, SIGKILL
   after the grace period) while the stream is still up;
2. the connection sends what it still has queued (a few seconds at most), so
   the control plane sees each shard reach `stopped`, then it is cancelled and
   its channel closed;
3. the supervisor's loop ends.

If a loop dies unexpectedly, the guard logs it and the TaskGroup cancels the
rest; cancelled shard watchers SIGKILL their engines, so nothing is orphaned.

Not guaranteed: that engines finish in-flight requests on shutdown (the grace
period is all they get).
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
) -> None:
    """Serve until `stop` is set, then stop every engine and disconnect."""
    async with asyncio.TaskGroup() as group:
        supervising = group.create_task(guard("supervisor", supervisor.run()))
        connected = group.create_task(guard("connection", connection.run()))
        await stop.wait()
        log.info("shutting down: stopping every engine (grace %gs)", grace_seconds)
        await supervisor.shutdown(grace=grace_seconds)
        await connection.flush(grace=FLUSH_SECONDS)
        connected.cancel()
        await supervising
    log.info("stopped")
