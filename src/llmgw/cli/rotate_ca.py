"""`llmgw certs rotate-ca`: replace the cluster CA in the store in two steps, without an outage.

Step 1 (`rotate-ca`) stores a new CA as "next", sealed with the cluster key
file. Every server trusts it at its next poll (a few seconds) and hands it to
nodes with each Join and Renew, so nodes learn to trust it as they renew (two
thirds into their certificate's lifetime) or re-join. Step 2 (`rotate-ca
--finish`) makes it the active CA: servers issue from it and present
certificates from it; the old CA is retired but still trusted until it
expires, so node certificates it issued keep working and renew into the new
CA. Join tokens made before step 2 carry the old CA's hash and are refused by
agents afterwards: make new ones. `--finish` refuses while some node's latest
certificate predates step 1 (that node does not trust the new CA yet and would
have to join again), unless `--force`.

Works on the store directly (like `llmgw keys`), with the cluster key file of
the servers (default `<data-dir>/cluster.key`). Not guaranteed: anything about
nodes that are offline for the whole rotation; they must join again.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer

from llmgw.cli.storeopts import (
    DEFAULT_DATA_DIR,
    BadInput,
    DataDirOption,
    StoreOption,
    run_with_store,
)


def rotate_ca(
    finish: Annotated[
        bool,
        typer.Option(
            "--finish",
            help="Step 2: make the new CA the active one (after the nodes have renewed).",
        ),
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="With --finish: go on although some nodes have not renewed since step 1 (they "
            "will have to join again).",
        ),
    ] = False,
    days: Annotated[int, typer.Option(min=1, help="Validity of the new CA in days.")] = 3650,
    cluster_key_file: Annotated[
        Path | None,
        typer.Option(
            envvar="LLMGW_CLUSTER_KEY_FILE",
            help="The servers' cluster key file [default: <data-dir>/cluster.key].",
            show_default=False,
        ),
    ] = None,
    data_dir: DataDirOption = DEFAULT_DATA_DIR,
    store: StoreOption = None,
) -> None:
    """Rotate the cluster CA: step 1 adds a CA that nodes learn to trust; --finish swaps it in."""
    from llmgw.control.agentsvc.cluster_pki import ClusterPkiError, sealed_ca, unseal_ca
    from llmgw.pki import PkiError
    from llmgw.pki.cluster import read_cluster_key
    from llmgw.store import Store

    key_path = (cluster_key_file or data_dir / "cluster.key").expanduser()
    try:
        key = read_cluster_key(key_path)
    except PkiError as exc:
        typer.echo(f"error: --cluster-key-file: {exc}", err=True)
        raise typer.Exit(code=2) from None

    async def begin(opened: Store) -> str:
        active = await opened.pki.active_ca()
        if active is None:
            raise BadInput("the store has no cluster CA yet: start a server on it (it creates one)")
        try:
            unseal_ca(key, active)
        except ClusterPkiError as exc:
            raise BadInput(str(exc)) from exc
        now = datetime.now(UTC)
        new = sealed_ca(key, role="next", now=now, lifetime=timedelta(days=days))
        await opened.pki.begin_rotation(new)
        return new.id

    async def end(opened: Store) -> tuple[str, list[str]]:
        cas = await opened.pki.cas()
        upcoming = next((ca for ca in cas if ca.role == "next"), None)
        if upcoming is None:
            raise BadInput("no CA rotation is under way: start one with `llmgw certs rotate-ca`")
        now = datetime.now(UTC)
        latest: dict[str, datetime] = {}
        for cert in await opened.pki.certificates(kind="node"):
            if cert.not_after > now:
                latest[cert.subject] = max(latest.get(cert.subject, cert.issued_at), cert.issued_at)
        behind = sorted(node for node, at in latest.items() if at < upcoming.created_at)
        if behind and not force:
            raise BadInput(
                f"{len(behind)} node(s) have not renewed since the rotation began and do not "
                f"trust the new CA yet: {', '.join(behind)}; wait until they renew (two thirds "
                "into their certificates' lifetime), restart their agents after a renewal, or "
                "pass --force (they will have to join again with a new token)"
            )
        done = await opened.pki.finish_rotation()
        return done.id, behind

    if not finish:
        new_id = run_with_store(data_dir, store, begin)
        typer.echo(f"step 1 done: a new cluster CA ({new_id[:16]}...) is trusted by every server")
        typer.echo(
            "nodes learn to trust it when they renew (two thirds into their certificate's "
            "lifetime) or join; then run:"
        )
        typer.echo("  llmgw certs rotate-ca --finish")
        return
    new_id, behind = run_with_store(data_dir, store, end)
    typer.echo(
        f"the cluster CA is now {new_id[:16]}...: servers issue from it within seconds; the old "
        "CA stays trusted until it expires, and nodes renew into the new one"
    )
    if behind:
        typer.echo(f"these nodes must join again with a new token: {', '.join(behind)}")
    typer.echo(
        "join tokens made before now name the old CA: make new ones (`llmgw nodes token create`)"
    )
