"""Usage: recording what each request used, and pruning old raw records.

The composition root builds one `UsageRecorder` (and a `RetentionPruner`) over
`store.usage`, runs their `run()` loops as guarded tasks, and awaits
`recorder.close()` after the HTTP servers have drained. The router calls
`recorder.record(UsageRecord(...))` per finished request. The limiter's budget
source is a `RecordedUsage` over the store and the recorder, so budgets count
tokens whose records are not written (yet, or ever). Reports read the
roll-ups through `UsageRepository.query` directly (`llmgw usage`).

Not guaranteed: exactly-once or complete recording; see `llmgw.usage.recorder`.
"""

from llmgw.usage.budget import RecordedUsage
from llmgw.usage.metrics import DROP_REASONS, DropReason, UsageMetrics
from llmgw.usage.recorder import UsageRecorder, UsageSink
from llmgw.usage.retention import RawUsagePruner, RetentionPruner

__all__ = [
    "DROP_REASONS",
    "DropReason",
    "RawUsagePruner",
    "RecordedUsage",
    "RetentionPruner",
    "UsageMetrics",
    "UsageRecorder",
    "UsageSink",
]
