"""Prometheus metrics objects, always on a registry handed in by the caller.

Nothing here touches prometheus-client's default global registry.
"""

from llmgw.metrics.history import HistoryPoint, MetricsHistory, RouterTotals
from llmgw.metrics.router import EndpointSnapshot, RouterMetrics

__all__ = ["EndpointSnapshot", "HistoryPoint", "MetricsHistory", "RouterMetrics", "RouterTotals"]
