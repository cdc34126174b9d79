"""The node agent: dials out to the control plane and runs engines on command.

Modules, each importable on its own (this package re-exports nothing, so that
`llmgw agent --help` and flag errors do not pay for gRPC):

- `flags`       command-line values → plain data (`FlagError` names the flag)
- `settings`    the tunables of the connection and the supervisor
- `hardware`    GPUs from NVML or `--gpus`, CPUs, memory, free weights disk
- `backoff`     full-jitter exponential backoff
- `connection`  the stream: dial each server in turn, register, heartbeats,
                commands, reconnect forever
- `wire`        the protobuf messages the agent sends, built in one place
- `feed`        fan-out of shard reports to the live stream
- `supervisor`  engine processes: validate, spawn, stop, drain, adopt; weights removal
- `shard`       one engine process's state machine (`ShardState`, `ShardReport`)
- `process`     engine processes detached from the agent, watched through pidfds
- `state`       the state directory and the engines state file (for adoption)
- `spec`        wire ShardSpec → engines' EngineSpec, with this node's checks
- `probe`       the readiness GET; `output` the engine output ring buffer and log follower
- `weights`     removal strictly inside the weights directory
- `hub`         hub snapshots on disk: one download per repo and commit, progress,
                what the node holds, eviction over `--weights-max-use`
- `node`        the process lifecycle: guarded loops in one TaskGroup, shutdown order
- `errors`      the exception tree
- `_deathsig_exec.py`  run as a script: arms PR_SET_PDEATHSIG, then execs (`llmgw up`'s agent)

Every long-lived object is built in `llmgw.cli.agent` and passed in.
"""
