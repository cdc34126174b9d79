"""The gRPC AgentService: agents' streams, reports into the inventory, commands down.

`AgentServicer` implements `Dispatcher`; `serve_agents` starts its listener;
`run_sweeper` ages silent nodes; `RegistrationPacer` paces registration storms;
`NodeRemoval` removes a node for good; `ClaimBatcher` writes node-id claims in batches.
"""

from llmgw.control.agentsvc.claims import ClaimBatcher
from llmgw.control.agentsvc.dispatcher import Dispatcher, ShardSpec
from llmgw.control.agentsvc.errors import (
    AgentListenerError,
    AgentServiceError,
    BadAgentMessage,
    CommandFailed,
    CommandTimeout,
    NodeNotConnected,
)
from llmgw.control.agentsvc.pacing import RegistrationPacer
from llmgw.control.agentsvc.removal import NodeRemoval, Removed
from llmgw.control.agentsvc.server import AgentListener, run_sweeper, serve_agents
from llmgw.control.agentsvc.servicer import AgentServicer, NodeReports

__all__ = [
    "AgentListener",
    "AgentListenerError",
    "AgentServiceError",
    "AgentServicer",
    "BadAgentMessage",
    "ClaimBatcher",
    "CommandFailed",
    "CommandTimeout",
    "Dispatcher",
    "NodeNotConnected",
    "NodeRemoval",
    "NodeReports",
    "RegistrationPacer",
    "Removed",
    "ShardSpec",
    "run_sweeper",
    "serve_agents",
]
