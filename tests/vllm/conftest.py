"""The real-vLLM tests' shared fleet (`vllm_fleet`, one vLLM for the session): see
`tests/vllm_fleet.py`."""

from vllm_fleet import vllm_fleet

__all__ = ["vllm_fleet"]
