"""Run as a script: arm PR_SET_PDEATHSIG(SIGKILL), then exec a program in place.

    python -I -S _deathsig_exec.py PARENT_PID -- ARGV...

Used by `llmgw up` for its local agent, so that a SIGKILLed `llmgw up` takes the
agent with it. (Engines are not started this way: they outlive their agent.)

Why a script and not `preexec_fn`: the parent has threads, and Python code in
a forked child of a threaded process may deadlock before exec. Here the prctl
runs in a fresh single-threaded interpreter, and exec keeps the setting, so the
kernel SIGKILLs the program when the thread that spawned it dies — even when
the parent is SIGKILLed.

If the parent died between fork and prctl, the signal would never come: the
parent pid check catches that and exits instead of running an orphan.

Not guaranteed: processes the program itself spawns get no such signal.
Linux only. Imports nothing from llmgw: it runs before any environment is set up.
"""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--":
        sys.stderr.write("usage: _deathsig_exec.py AGENT_PID -- ARGV...\n")
        return 2
    agent_pid, argv = int(args[0]), args[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        sys.stderr.write(f"llmgw agent: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(err)}\n")
        return 126
    if os.getppid() != agent_pid:
        return 137  # the agent is already gone; never run an orphan
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        sys.stderr.write(f"llmgw agent: cannot run {argv[0]!r}: {exc.strerror}\n")
        return 127
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
