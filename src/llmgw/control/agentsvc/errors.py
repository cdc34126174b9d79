"""The agent service's exception tree: why a command did not get done.

    AgentServiceError
    ├── NodeNotConnected   no open stream to the node (never connected, gone,
    │                      or the stream closed while the command waited)
    ├── CommandTimeout     the node did not answer within the deadline
    └── CommandFailed      the node answered and said no (its message included)

Outside that tree: `BadAgentMessage` (an agent broke the protocol; its stream
ends) and `AgentListenerError` (the listener cannot start).

`retryable` says whether trying the same command later can succeed without
anyone changing anything: a node reconnects, a slow node answers next time; a
refusal (bad spec, path outside the weights directory) repeats until fixed.
Not guaranteed: that a timed-out command did not happen; the node may still act
on it and report the outcome as a shard status.
"""

from __future__ import annotations


class AgentServiceError(Exception):
    """Base of every failure a `Dispatcher` call raises."""

    retryable = False

    def __init__(self, message: str, *, node_id: str) -> None:
        super().__init__(message)
        self.message = message
        self.node_id = node_id


class NodeNotConnected(AgentServiceError):
    """No stream from the node is open, so no command can reach it."""

    retryable = True


class CommandTimeout(AgentServiceError):
    """The node did not answer the command in time."""

    retryable = True


class CommandFailed(AgentServiceError):
    """The node answered the command with an error; `error` is the agent's message."""

    def __init__(self, message: str, *, node_id: str, error: str) -> None:
        super().__init__(message, node_id=node_id)
        self.error = error


class BadAgentMessage(Exception):
    """A message from an agent breaks the protocol; its stream ends with INVALID_ARGUMENT.

    Not part of the `Dispatcher` tree: it is raised while reading a stream, and
    the message is sent back to the agent, so it says what to fix.
    """


class AgentListenerError(Exception):
    """The agent listener cannot start (address in use, bad host); a startup failure."""
