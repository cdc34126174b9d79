"""Per-API-key rate limits (RPM, TPM) and token budgets, in memory or shared through Redis.

The router builds nothing here: `cli/server.py` constructs one `Limiter` (and
its `LimitMetrics`) and passes it in. Per request the router calls
`estimate_prompt_tokens(body)`, `await limiter.admit(limits, estimate)` —
which raises a `LimitExceeded` subclass for a 429 — and after the response
`await limiter.settle(limits, admission, actual_tokens)`.
"""

from llmgw.limits.errors import BudgetExhausted, LimitExceeded, RateLimited
from llmgw.limits.estimate import estimate_prompt_tokens
from llmgw.limits.headers import format_duration
from llmgw.limits.limiter import Limiter
from llmgw.limits.metrics import LimitMetrics
from llmgw.limits.model import (
    END_USER_PREFIX,
    TEAM_PREFIX,
    Admission,
    BudgetPeriod,
    BudgetSource,
    KeyLimits,
    end_user_limits,
    split_end_user,
)

__all__ = [
    "END_USER_PREFIX",
    "TEAM_PREFIX",
    "Admission",
    "BudgetExhausted",
    "BudgetPeriod",
    "BudgetSource",
    "KeyLimits",
    "LimitExceeded",
    "LimitMetrics",
    "Limiter",
    "RateLimited",
    "end_user_limits",
    "estimate_prompt_tokens",
    "format_duration",
    "split_end_user",
]
