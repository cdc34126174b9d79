"""Placement records: what the leader placed where, and which node reports to believe.

`PlacementBook` (the term's records, written through to the store) is what the
reconciler records its starts in and what the agent service judges every
shard report against (`vetting`); `Placement` is one record.
"""

from llmgw.control.placements.book import PlacementBook, PlacementError, PlacementStore
from llmgw.control.placements.model import Placement, spec_from_json, spec_json
from llmgw.control.placements.vetting import NodeAddress, Verdict, endpoint_problem, vet

__all__ = [
    "NodeAddress",
    "Placement",
    "PlacementBook",
    "PlacementError",
    "PlacementStore",
    "Verdict",
    "endpoint_problem",
    "spec_from_json",
    "spec_json",
    "vet",
]
