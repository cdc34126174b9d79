"""Which client APIs besides OpenAI's each kind of engine serves natively.

The router serves Anthropic's Messages API (`/v1/messages`) and OpenAI's
Responses API (`/v1/responses`) for every engine: to an engine that serves one
natively it passes the request through as bytes, to the others it sends the
request translated into a chat completion. Which is which is a property of
the engine, declared here and reported by each adapter
(`EngineAdapter.native_apis`):

- vLLM serves both: `/v1/responses` since 0.10 and `/v1/messages`
  (`vllm.entrypoints.anthropic`) since 0.11.1.
- SGLang serves `/v1/responses` (`serving_responses.py`), not Messages.
- llama-cpp-python's server serves neither.
- `llmgw sim` serves those it is told to with `--native-apis messages,responses`.

Not guaranteed: that an older engine release has the route; an engine that
lacks it answers 404, which is passed on.
"""

from __future__ import annotations

from collections.abc import Sequence

MESSAGES = "messages"
RESPONSES = "responses"
CLIENT_APIS: tuple[str, ...] = (MESSAGES, RESPONSES)
"""The APIs an engine may serve natively, in the order messages list them."""

NONE: frozenset[str] = frozenset()
BOTH: frozenset[str] = frozenset(CLIENT_APIS)


def flag_value(engine_args: Sequence[str], flag: str) -> str | None:
    """The value `engine_args` give `flag` (`--flag V` or `--flag=V`; the last one
    wins, as click and argparse take it); None when they do not set it."""
    value: str | None = None
    args = list(engine_args)
    for index, arg in enumerate(args):
        if arg == flag and index + 1 < len(args):
            value = args[index + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value


def parse_apis(value: str) -> frozenset[str]:
    """`messages,responses` as a set; ValueError naming a value that is neither."""
    apis = {part.strip() for part in value.split(",") if part.strip()}
    unknown = sorted(apis - BOTH)
    if unknown:
        raise ValueError(
            f"unknown API {unknown[0]!r}: use a comma-separated list of {', '.join(CLIENT_APIS)}"
        )
    return frozenset(apis)
