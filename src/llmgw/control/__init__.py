"""The control plane: what runs where on the GPU fleet, and the stream to each node.

Sub-packages, each small and talking to its siblings through Protocols:
`inventory` (nodes, GPUs and shards as agents report them), `agentsvc` (the gRPC
service the agents dial; the only way a command reaches a node) and `adminapi`
(the admin REST routes over them). Nothing here is built at import time; the
objects are constructed in `llmgw.cli` and passed in.
"""
