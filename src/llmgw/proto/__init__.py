"""Generated protobuf and gRPC code for the agent stream; regenerate with `make proto`.

Not hand-edited, and excluded from lint and type checks.
"""
