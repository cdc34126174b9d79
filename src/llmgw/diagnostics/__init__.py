"""Looking inside a running llmgw process: task and thread stacks, a CPU profiler, memory.

Used by the admin listener's `/debug/*` endpoints (`llmgw.router.debug`) and by
the agent's SIGUSR1 stack dump. Imports nothing else of llmgw, so any layer
may use it. Nothing here runs until asked: no background thread, no tracing.

Not guaranteed: consistent snapshots (the process keeps running while it is
looked at), or low cost for the memory report on a very large heap.
"""

from llmgw.diagnostics.memory import (
    DEFAULT_FRAMES,
    MAX_FRAMES,
    AllocationTracer,
    TracingError,
    memory_report,
    render_memory,
)
from llmgw.diagnostics.profiler import (
    DEFAULT_INTERVAL,
    MAX_INTERVAL,
    MAX_SECONDS,
    MIN_INTERVAL,
    Profile,
    Profiler,
    ProfilerBusy,
)
from llmgw.diagnostics.signals import install_stack_dump
from llmgw.diagnostics.stacks import (
    Group,
    PathNames,
    Stack,
    group,
    render,
    report,
    task_stacks,
    thread_stacks,
)

__all__ = [
    "DEFAULT_FRAMES",
    "DEFAULT_INTERVAL",
    "MAX_FRAMES",
    "MAX_INTERVAL",
    "MAX_SECONDS",
    "MIN_INTERVAL",
    "AllocationTracer",
    "Group",
    "PathNames",
    "Profile",
    "Profiler",
    "ProfilerBusy",
    "Stack",
    "TracingError",
    "group",
    "install_stack_dump",
    "memory_report",
    "render",
    "render_memory",
    "report",
    "task_stacks",
    "thread_stacks",
]
