"""`llmgw certs`: a small CA for the agent listener's mTLS, and its certificates.

`init` creates the CA (`ca.crt`, `ca.key`) in a folder; `issue --server HOST`
signs the control plane's certificate (one alternative name per host agents
dial), `issue --node NAME` a node agent's (its name is the node id the server
accepts). Each prints the files it wrote and the config or flags that use
them. Keys are written 0600; nothing is overwritten without --force.

Not guaranteed: revocation (there is no CRL: rotate the CA, or keep node
certificates short-lived with --days) or any protection of `ca.key` beyond its
file mode; keep the CA folder off the GPU nodes.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

if TYPE_CHECKING:
    from llmgw.pki import Issued, PkiError

certs_app = typer.Typer(
    name="certs",
    help="Certificates for mTLS between the server and its agents: a CA, server and "
    "node certificates.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

EXIT_BAD_INPUT = 2
EXIT_FILES = 1

DirOption = Annotated[
    Path,
    typer.Option(
        "--dir",
        help="Folder of the CA (ca.crt, ca.key); keep it on an admin host, not on the nodes.",
    ),
]
DaysOption = Annotated[
    int | None,
    typer.Option(
        "--days",
        help="Validity in days (default: 3650 for the CA, 825 for server and node "
        "certificates, capped at the CA's end).",
        show_default=False,
    ),
]
KeyTypeOption = Annotated[
    str, typer.Option("--key-type", help="ec (P-256, default) or rsa (2048 bits).")
]
ForceOption = Annotated[
    bool, typer.Option("--force", help="Overwrite files that exist (a new CA voids old certs).")
]


def _now() -> datetime:
    return datetime.now(UTC)


def _fail(exc: PkiError) -> NoReturn:
    from llmgw.pki import PkiExistsError, PkiInputError

    typer.echo(f"error: {exc}", err=True)
    bad_input = isinstance(exc, PkiInputError | PkiExistsError)
    raise typer.Exit(code=EXIT_BAD_INPUT if bad_input else EXIT_FILES)


def _key_type(value: str) -> str:
    if value not in ("ec", "rsa"):
        typer.echo(f"error: --key-type {value!r}: give ec or rsa", err=True)
        raise typer.Exit(code=EXIT_BAD_INPUT)
    return value


def _written(issued: Issued) -> None:
    typer.echo(f"wrote {issued.cert.resolve()}")
    typer.echo(f"wrote {issued.key.resolve()} (private key, mode 0600)")
    typer.echo(
        f"names: {', '.join(issued.names)}; valid until {issued.not_after:%Y-%m-%d %H:%M} UTC"
    )


@certs_app.command("init")
def init(
    directory: DirOption,
    name: Annotated[
        str | None,
        typer.Option("--name", help="The CA's common name.", show_default="llmgw agent CA"),
    ] = None,
    days: DaysOption = None,
    key_type: KeyTypeOption = "ec",
    force: ForceOption = False,
) -> None:
    """Create a CA: DIR/ca.crt (give it to servers and agents) and DIR/ca.key (keep it)."""
    from llmgw import pki

    try:
        issued = pki.init_ca(
            directory,
            now=_now(),
            name=pki.DEFAULT_CA_NAME if name is None else name,
            days=pki.DEFAULT_CA_DAYS if days is None else days,
            key_type="rsa" if _key_type(key_type) == "rsa" else "ec",
            force=force,
        )
    except pki.PkiError as exc:
        _fail(exc)
    _written(issued)
    typer.echo("")
    typer.echo("next:")
    typer.echo(f"  llmgw certs issue --dir {directory} --server HOST [--server HOST ...]")
    typer.echo(f"  llmgw certs issue --dir {directory} --node NODE_ID")


@certs_app.command("issue")
def issue(
    directory: DirOption,
    server: Annotated[
        list[str] | None,
        typer.Option(
            "--server",
            help="A host name or IP agents dial to reach the server (repeat for each; every "
            "one goes into the certificate). Issues a server certificate.",
            show_default=False,
        ),
    ] = None,
    node: Annotated[
        str | None,
        typer.Option(
            "--node",
            help="A node id: issues that node agent's client certificate (CN = the id).",
            show_default=False,
        ),
    ] = None,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out-dir", help="Where to write the files (default: --dir).", show_default=False
        ),
    ] = None,
    days: DaysOption = None,
    key_type: KeyTypeOption = "ec",
    force: ForceOption = False,
) -> None:
    """Issue a server certificate (--server HOST ...) or a node certificate (--node NAME)."""
    from llmgw import pki

    if bool(server) == (node is not None):
        typer.echo(
            "error: give either --server HOST (repeatable) or --node NAME, not both or neither",
            err=True,
        )
        raise typer.Exit(code=EXIT_BAD_INPUT)
    chosen: pki.KeyType = "rsa" if _key_type(key_type) == "rsa" else "ec"
    valid = pki.DEFAULT_LEAF_DAYS if days is None else days
    ca = (directory / pki.CA_CERT).resolve()
    try:
        if server:
            issued = pki.issue_server(
                directory, server, now=_now(), days=valid, out_dir=out_dir, key_type=chosen,
                force=force,
            )  # fmt: skip
        else:
            assert node is not None
            issued = pki.issue_node(
                directory, node, now=_now(), days=valid, out_dir=out_dir, key_type=chosen,
                force=force,
            )  # fmt: skip
    except pki.PkiError as exc:
        _fail(exc)
    _written(issued)
    typer.echo("")
    if server:
        typer.echo("in the server's config file (llmgw server --config FILE):")
        typer.echo("  agent_tls:")
        typer.echo(f"    cert: {issued.cert.resolve()}")
        typer.echo(f"    key: {issued.key.resolve()}")
        typer.echo(f"    ca: {ca}")
        typer.echo(f"agents then dial one of: {', '.join(issued.names)} (with the listener's port)")
    else:
        typer.echo("copy the certificate, its key and ca.crt to the node, then:")
        typer.echo(
            f"  llmgw agent --server HOST:9443 --tls-ca {ca} --tls-cert {issued.cert.resolve()} "
            f"--tls-key {issued.key.resolve()}"
        )
        typer.echo(
            f"(the node id defaults to {node!r}, the certificate's name; the server refuses any "
            "other)"
        )


# `llmgw certs rotate-ca` works on the store's cluster CA; it lives in its own module.
from llmgw.cli.rotate_ca import rotate_ca  # noqa: E402

certs_app.command("rotate-ca")(rotate_ca)
