"""The simulated OpenAI-compatible engine behind `llmgw sim`.

A raw ASGI app (`llmgw.sim.app.create_app`) that answers chat, completion and embedding
requests (and rerank, score, tokenizer and audio ones, `llmgw.sim.extras`)
with deterministic text, a vLLM-like timing model (FIFO admission, prefill
cost reduced by a prefix cache, inter-token latency that grows with the batch),
vLLM-named Prometheus metrics and run-time fault injection. Objects are built by
`llmgw.cli.sim`; nothing here is created at import.

Not guaranteed: fidelity to any real model's tokenizer, text or performance curve. The
timings are a model for exercising a gateway, not a benchmark of a GPU.
"""
