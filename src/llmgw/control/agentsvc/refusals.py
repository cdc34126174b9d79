"""What the agent service does with a shard report it does not believe.

The servicer judges every shard a node reports (at Register and in each
ShardStatus) against the placement records (`llmgw.control.placements`).
For a report that is refused, `ShardRefusals.refused`:

- logs the reason at warning and counts it
  (`llmgw_agent_shard_reports_refused_total{reason}`);
- records it as a `shard` event about the node, at most once per shard and
  `EVENT_REPEAT_SECONDS`, and at most `EVENTS_PER_NODE` per node in that
  window (a node inventing shard ids cannot push everything else out of the
  event list; the log keeps every refusal);
- when the report says an engine runs, sends the node a StopShard for it,
  without waiting on the stream: the answer is logged. One stop per shard is
  outstanding at a time, and at most `MAX_OUTSTANDING_STOPS` per stream.

Not guaranteed: that the engine stops. An agent that is not llmgw's may
ignore the command; what it serves is never published either way.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from functools import partial

from llmgw.control.agentsvc.metrics import AgentMetrics
from llmgw.control.agentsvc.session import CommandOutcome, NodeSession
from llmgw.control.placements import Verdict
from llmgw.proto import agent_pb2

log = logging.getLogger("llmgw.control.agentsvc")

EVENT_REPEAT_SECONDS = 600.0
EVENTS_PER_NODE = 20
MAX_OUTSTANDING_STOPS = 64
_MAX_NOTED = 5000


class ShardRefusals:
    """Events, metrics and StopShard commands for refused shard reports."""

    def __init__(
        self,
        *,
        record_event: Callable[[str, str], None] | None,
        clock: Callable[[], float],
        stop_grace: float,
        metrics: AgentMetrics | None,
    ) -> None:
        self._record_event = record_event
        self._clock = clock
        self._stop_grace = stop_grace
        self._metrics = metrics
        self._noted: dict[tuple[str, str], float] = {}
        self._per_node: dict[str, list[float]] = {}

    def refused(self, session: NodeSession, shard_id: str, verdict: Verdict) -> None:
        """Act on a refused report of `shard_id` from `session`'s node. Never awaits."""
        assert verdict.refused is not None
        log.warning("%s (stream from %s)", verdict.refused, session.peer)
        if self._metrics is not None and verdict.kind is not None:
            self._metrics.refused_shard(verdict.kind)
        self._note(session.node_id, shard_id, verdict.refused)
        if verdict.stop:
            self._stop(session, shard_id)

    def _note(self, node_id: str, shard_id: str, message: str) -> None:
        if self._record_event is None:
            return
        now = self._clock()
        noted = self._noted.get((node_id, shard_id))
        if noted is not None and now - noted < EVENT_REPEAT_SECONDS:
            return
        recent = [t for t in self._per_node.get(node_id, ()) if now - t < EVENT_REPEAT_SECONDS]
        if len(recent) >= EVENTS_PER_NODE:
            self._per_node[node_id] = recent
            return
        if len(self._noted) >= _MAX_NOTED:
            self._noted = {k: t for k, t in self._noted.items() if now - t < EVENT_REPEAT_SECONDS}
        self._noted[(node_id, shard_id)] = now
        self._per_node[node_id] = [*recent, now]
        if len(recent) + 1 == EVENTS_PER_NODE:
            message += (
                f" (the last such event about node {node_id} for {EVENT_REPEAT_SECONDS:g} s; "
                "the server log has every refusal)"
            )
        self._record_event(node_id, message)

    def _stop(self, session: NodeSession, shard_id: str) -> None:
        if shard_id in session.refused_stops:
            return
        if len(session.refused_stops) >= MAX_OUTSTANDING_STOPS:
            log.warning(
                "node %s has %d stops of refused shards unanswered; not stopping %s",
                session.node_id,
                len(session.refused_stops),
                shard_id,
            )
            return
        command_id = uuid.uuid4().hex
        answer = session.expect(command_id)
        session.refused_stops.add(shard_id)
        answer.add_done_callback(partial(_answered, session, command_id, shard_id))
        session.send(
            agent_pb2.ServerMessage(
                command_id=command_id,
                stop_shard=agent_pb2.StopShard(shard_id=shard_id, grace_seconds=self._stop_grace),
            )
        )
        log.info(
            "told node %s to stop shard %s (command %s)", session.node_id, shard_id, command_id
        )


def _answered(
    session: NodeSession,
    command_id: str,
    shard_id: str,
    answer: asyncio.Future[CommandOutcome],
) -> None:
    session.forget(command_id)
    session.refused_stops.discard(shard_id)
    if answer.cancelled():
        return
    error = answer.exception()
    if error is not None:
        log.info(
            "node %s did not answer the stop of shard %s: %s", session.node_id, shard_id, error
        )
        return
    outcome = answer.result()
    if outcome.ok:
        log.info("node %s stopped shard %s", session.node_id, shard_id)
    else:
        log.warning(
            "node %s refused to stop shard %s: %s",
            session.node_id,
            shard_id,
            outcome.error or "no reason given",
        )
