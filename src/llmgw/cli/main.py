"""The `llmgw` command: a typer app whose sub-commands live one module each."""

from __future__ import annotations

import os

import typer

from llmgw import __version__
from llmgw.cli import agent as agent_cmd
from llmgw.cli import certs as certs_cmd
from llmgw.cli import db as db_cmd
from llmgw.cli import debug as debug_cmd
from llmgw.cli import events as events_cmd
from llmgw.cli import keys as keys_cmd
from llmgw.cli import models as models_cmd
from llmgw.cli import nodes as nodes_cmd
from llmgw.cli import server as server_cmd
from llmgw.cli import sim as sim_cmd
from llmgw.cli import status as status_cmd
from llmgw.cli import teams as teams_cmd
from llmgw.cli import tokens as tokens_cmd
from llmgw.cli import up as up_cmd
from llmgw.cli import usage as usage_cmd
from llmgw.cli import users as users_cmd
from llmgw.cli.logopts import LogFormat, setup_logging

app = typer.Typer(
    name="llmgw",
    help=(
        "llmgw: one OpenAI-compatible endpoint in front of a self-hosted GPU fleet.\n\n"
        "Start the gateway with `llmgw server`, or a simulated engine for tests and "
        "demos with `llmgw sim`."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Help texts are plain text: with rich markup, "[default: unlimited]" in a help
    # string was taken for a markup tag and vanished, leaving a stray " .".
    # Sub-commands inherit this from the root app.
    rich_markup_mode=None,
)


@app.callback()
def _root(log_format: LogFormat = "human") -> None:
    # Every command's warnings in the chosen format; the long-running commands
    # configure logging again with their --log-level. Their own --log-format reads
    # LLMGW_LOG_FORMAT, set here (before they parse their options), so
    # `llmgw --log-format json server` holds for the server too, and for the
    # processes it starts.
    setup_logging("warning", log_format)
    os.environ["LLMGW_LOG_FORMAT"] = log_format.strip().lower()


@app.command()
def version() -> None:
    """Print the llmgw version."""
    typer.echo(f"llmgw {__version__}")


app.command(
    name="server",
    help="Run the gateway: the OpenAI-compatible API, the admin listener and metrics.",
)(server_cmd.server)
app.command(
    name="sim",
    help="Run a simulated OpenAI-compatible engine (for tests, benchmarks and demos).",
)(sim_cmd.sim)
app.command(
    name="agent",
    help="Run the node agent: dial out to the control plane and run engines on command.\n\n"
    "The agent has no HTTP listener; to see what it is doing, `kill -USR1 PID` writes "
    "every thread's stack and every asyncio task's stack to its log (stderr), and it "
    "keeps running.",
)(agent_cmd.agent)
app.add_typer(keys_cmd.keys_app, name="keys")
app.add_typer(users_cmd.users_app, name="users")
app.add_typer(teams_cmd.teams_app, name="teams")
app.command(name="usage")(usage_cmd.usage)
app.add_typer(db_cmd.db_app, name="db")
nodes_cmd.nodes_app.add_typer(tokens_cmd.token_app, name="token")
app.add_typer(nodes_cmd.nodes_app, name="nodes")
app.add_typer(certs_cmd.certs_app, name="certs")
app.add_typer(models_cmd.models_app, name="models")
app.command(name="status")(status_cmd.status)
app.command(name="events")(events_cmd.events)
app.add_typer(debug_cmd.debug_app, name="debug")
app.command(
    name="up",
    help="Quickstart: the gateway, a local agent and its models on this machine.",
)(up_cmd.up)


def main() -> None:
    # gRPC's core writes its own INFO lines to stderr (e.g. "Handshake failed ..."
    # for every TLS client without a certificate: each join's chain check, each
    # plaintext agent). Our logs say what happened and what to do; keep gRPC's to
    # errors unless the operator asks for more (GRPC_VERBOSITY=INFO or DEBUG).
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    app()
