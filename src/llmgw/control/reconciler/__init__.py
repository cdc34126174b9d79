"""The reconciler: what should start and stop where, and why a model is not running.

`plan` is the pure core (desired replicas + the fleet → actions), `explain`
the dry run ("where would this go / why not here"); `placement` holds the
filters and scorers both use.
"""

from llmgw.control.reconciler.placement import (
    DEFAULT_FILTERS,
    Filter,
    Fleet,
    Need,
    NodeCapacity,
    Scorer,
    explain,
    filter_gpu_kind,
    filter_gpus,
    filter_labels,
    filter_node_state,
    filter_ports,
    score_pack,
    score_spread,
)
from llmgw.control.reconciler.plan import plan
from llmgw.control.reconciler.types import (
    Action,
    Actual,
    Desired,
    Explanation,
    Pending,
    Placement,
    PlacementPolicy,
    Plan,
    ProfileVerdict,
    Rejection,
    Start,
    Stop,
    StopReason,
)

__all__ = [
    "DEFAULT_FILTERS",
    "Action",
    "Actual",
    "Desired",
    "Explanation",
    "Filter",
    "Fleet",
    "Need",
    "NodeCapacity",
    "Pending",
    "Placement",
    "PlacementPolicy",
    "Plan",
    "ProfileVerdict",
    "Rejection",
    "Scorer",
    "Start",
    "Stop",
    "StopReason",
    "explain",
    "filter_gpu_kind",
    "filter_gpus",
    "filter_labels",
    "filter_node_state",
    "filter_ports",
    "plan",
    "score_pack",
    "score_spread",
]
