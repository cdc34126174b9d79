"""The real-vLLM tests' shared fleet (`vllm_fleet`, one vLLM for the session) and
`llmgw up --vllm` (`vllm_up`): see `tests/vllm_fleet.py`."""

from vllm_fleet import vllm_fleet, vllm_up

__all__ = ["vllm_fleet", "vllm_up"]
