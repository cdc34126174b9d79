"""`AdapterLoads` alone: which replica of the base an adapter is loaded into, which idle
adapter makes room (the least valuable: fewest recent requests), when a hot adapter is
spread to one more replica, and what a request is told when it cannot be loaded."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import Any

import pytest

from llmgw.control.agentsvc.errors import CommandFailed
from llmgw.control.catalog import Catalog, CatalogModel, parse_model
from llmgw.control.inventory.model import Node, Shard, ShardSpec
from llmgw.control.reconciler.adapters import BUSY_RETRY_AFTER, HALF_LIFE, AdapterLoads
from llmgw.control.reconciler.errors import ActivationRefused, AdapterRefused

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def catalog(names: str = "abcde") -> Catalog:
    entries: list[dict[str, Any]] = [
        {
            "name": "base",
            "weights": "none",
            "profiles": [{"name": "sim", "engine": "sim", "adapters": {"max_loaded": 2}}],
        },
        *({"name": n, "adapter_of": "base", "weights": f"/a/{n}"} for n in names),
    ]
    return Catalog(
        repo=None,
        config_models=[parse_model(e, source="config") for e in entries],
        config_file=None,
    )


def replica(node_id: str, shard_id: str, *adapters: str) -> Node:
    args = ("--enable-lora", "--max-loras", "2", "--max-lora-rank", "16")
    spec = ShardSpec(shard_id=shard_id, model="base", engine="sim", weights="none")
    shard = Shard(
        id=shard_id,
        model="base",
        engine="sim",
        state="ready",
        message="",
        pid=1,
        endpoint_url=f"http://{node_id}:8000",
        output_tail=(),
        exit_code=None,
        spec=dataclasses.replace(spec, engine_args=args),
        since=EPOCH,
        adapters=adapters,
    )
    return Node(
        id=node_id, hostname=node_id, agent_version="0.1.0", gpus=(), cpu_count=8,
        memory_total=0, weights_disk_free=0, gpu_source="declared", labels={}, fabric={},
        port_range=(20000, 20009), weights_dir="/w", state="ready", draining=False,
        connected=True, registered_at=EPOCH, last_heartbeat=0.0, last_heartbeat_at=EPOCH,
        shards={shard_id: shard},
    )  # fmt: skip


class Agents:
    """Does the commands on the nodes' shards, as an agent's report would show them."""

    def __init__(self, nodes: list[Node], refuse: str = "") -> None:
        self.nodes = nodes
        self.refuse = refuse
        self.sent: list[tuple[str, str, str]] = []

    def _change(self, node_id: str, shard_id: str, adapters: tuple[str, ...]) -> None:
        node = next(n for n in self.nodes if n.id == node_id)
        node.shards[shard_id] = dataclasses.replace(node.shards[shard_id], adapters=adapters)

    async def load_adapter(
        self, node_id: str, shard_id: str, name: str, path: str, wait_seconds: float
    ) -> None:
        self.sent.append(("load", shard_id, name))
        if self.refuse:
            raise CommandFailed("refused", node_id=node_id, error=self.refuse)
        node = next(n for n in self.nodes if n.id == node_id)
        self._change(node_id, shard_id, (*node.shards[shard_id].adapters, name))

    async def unload_adapter(
        self, node_id: str, shard_id: str, name: str, wait_seconds: float
    ) -> None:
        self.sent.append(("unload", shard_id, name))
        node = next(n for n in self.nodes if n.id == node_id)
        kept = tuple(a for a in node.shards[shard_id].adapters if a != name)
        self._change(node_id, shard_id, kept)


class Clock:
    def __init__(self, step: float = 1.0) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def loads(
    agents: Agents,
    *,
    leading: bool = True,
    asked: list[str] | None = None,
    names: str = "abcde",
    clock: Clock | None = None,
    tasks: list[asyncio.Task[None]] | None = None,
) -> tuple[AdapterLoads, Catalog]:
    """`asked`: where a standby's requests to the leader are written."""
    book = catalog(names)
    activated: list[str] = []
    spawned = tasks if tasks is not None else []

    def spawn(coro: Coroutine[Any, Any, None], name: str) -> None:
        spawned.append(asyncio.get_running_loop().create_task(coro, name=name))

    async def activate_base(name: str) -> None:
        activated.append(name)

    async def ask_leader(entry: CatalogModel) -> None:
        assert asked is not None
        asked.append(entry.name)

    return (
        AdapterLoads(
            catalog=book,
            nodes=lambda: agents.nodes,
            dispatcher=agents,  # type: ignore[arg-type]
            clock=clock or Clock(),
            activate_base=activate_base,
            published=lambda name: False,
            publish=lambda: None,
            leading=lambda: leading,
            ask_leader=ask_leader,
            wait_seconds=5.0,
            spawn=spawn,
        ),
        book,
    )


def adapter(book: Catalog, name: str) -> CatalogModel:
    entry = book.entry(name)
    assert entry is not None
    return entry


async def test_it_loads_into_the_replica_with_the_most_free_slots() -> None:
    agents = Agents([replica("n1", "r1", "a"), replica("n2", "r2")])
    book_loads, book = loads(agents)
    await book_loads.ensure(adapter(book, "b"))
    assert agents.sent == [("load", "r2", "b")]
    # Loaded somewhere already: nothing more to do.
    await book_loads.ensure(adapter(book, "a"))
    assert agents.sent == [("load", "r2", "b")]


async def test_a_full_replica_unloads_its_least_valuable_idle_adapter() -> None:
    agents = Agents([replica("n1", "r1", "a", "b")])
    book_loads, book = loads(agents)
    a, b = adapter(book, "a"), adapter(book, "b")
    book_loads.started(b)
    book_loads.finished(b)
    book_loads.started(a)
    book_loads.finished(a)  # asked for as often, a used last: b is the one to go
    await book_loads.ensure(adapter(book, "c"))
    assert agents.sent == [("unload", "r1", "b"), ("load", "r1", "c")]
    # With a request in flight on each loaded adapter, none is unloaded.
    book_loads.started(a)
    book_loads.started(adapter(book, "c"))
    with pytest.raises(ActivationRefused) as busy:
        await book_loads.ensure(adapter(book, "d"))
    assert busy.value.retry_after == BUSY_RETRY_AFTER
    assert "every adapter slot" in busy.value.message
    assert agents.sent[-1] == ("load", "r1", "c")


async def test_with_every_replica_full_the_bases_least_valuable_idle_adapter_goes() -> None:
    agents = Agents([replica("n1", "r1", "a", "b"), replica("n2", "r2", "c", "d")])
    book_loads, book = loads(agents)
    for name in "cabd":  # c used least recently, and it is on the second replica
        book_loads.started(adapter(book, name))
        book_loads.finished(adapter(book, name))
    await book_loads.ensure(adapter(book, "e"))
    assert agents.sent == [("unload", "r2", "c"), ("load", "r2", "e")]
    # The first replica's adapters are all serving: room is made on the second one,
    # where an idle adapter is, instead of refusing.
    book_loads.started(adapter(book, "e"))
    book_loads.started(adapter(book, "a"))
    book_loads.started(adapter(book, "b"))
    await book_loads.ensure(adapter(book, "c"))
    assert agents.sent[2:] == [("unload", "r2", "d"), ("load", "r2", "c")]


async def test_the_engines_refusal_is_the_requests_answer() -> None:
    words = "the engine refused adapter 'b': LoRA rank 64 is greater than max_lora_rank 16."
    agents = Agents([replica("n1", "r1")], refuse=words)
    book_loads, book = loads(agents)
    with pytest.raises(AdapterRefused) as refused:
        await book_loads.ensure(adapter(book, "b"))
    assert refused.value.code == "adapter_refused"
    assert words in refused.value.public


async def test_a_standby_asks_the_leader_and_loads_nothing_itself() -> None:
    agents = Agents([replica("n1", "r1")])
    asked: list[str] = []
    book_loads, book = loads(agents, leading=False, asked=asked)
    await book_loads.ensure(adapter(book, "b"))
    assert asked == ["b"]
    assert agents.sent == []


async def test_the_leader_loads_what_other_servers_ask_for_once_and_retries_a_refusal() -> None:
    agents = Agents([replica("n1", "r1", "a", "c")])
    book_loads, book = loads(agents)
    spawned: list[Coroutine[Any, Any, None]] = []

    def spawn(coro: Coroutine[Any, Any, None], name: str) -> None:
        spawned.append(coro)

    # "a" and "c" are loaded and in use: no room for "b" now.
    for name in "ac":
        book_loads.started(adapter(book, name))
    # Names that are not adapters (models, unknown) are not for it.
    book_loads.load_for_others(["b", "base", "nothing"], spawn)
    assert len(spawned) == 1
    # Asked again while that load is under way: not a second load.
    book_loads.load_for_others(["b"], spawn)
    assert len(spawned) == 1
    await spawned.pop()
    assert agents.sent == []  # refused: every slot serves requests
    # Not before its retry_after has passed (the clock moves a second a read).
    book_loads.load_for_others(["b"], spawn)
    assert spawned == []
    book_loads.finished(adapter(book, "a"))
    book_loads.load_for_others(["b"], spawn)
    assert len(spawned) == 1
    await spawned.pop()
    assert agents.sent == [("unload", "r1", "a"), ("load", "r1", "b")]


def use(book_loads: AdapterLoads, book: Catalog, name: str, times: int = 1) -> None:
    for _ in range(times):
        book_loads.started(adapter(book, name))
        book_loads.finished(adapter(book, name))


async def test_a_hot_adapter_survives_a_burst_of_one_off_requests() -> None:
    """Where LRU would unload the adapter most requests want (it was not the last one
    used), the decayed request count keeps it and lets the one-offs replace each other."""
    agents = Agents([replica("n1", "r1", "h", "o")])
    book_loads, book = loads(agents, names="hopqrs")
    use(book_loads, book, "h", times=20)
    use(book_loads, book, "o")  # h is now the least recently used of the two
    for one_off in "pqrs":
        use(book_loads, book, one_off)  # counted as it starts, before the load
        await book_loads.ensure(adapter(book, one_off))
        assert "h" in agents.nodes[0].shards["r1"].adapters
    assert [s for s in agents.sent if s[0] == "unload"] == [
        ("unload", "r1", "o"),
        ("unload", "r1", "p"),
        ("unload", "r1", "q"),
        ("unload", "r1", "r"),
    ]


async def test_an_adapter_no_longer_asked_for_loses_its_value_with_time() -> None:
    """The count halves every HALF_LIFE seconds: yesterday's favourite goes."""
    clock = Clock(step=1.0)
    agents = Agents([replica("n1", "r1", "h", "o")])
    book_loads, book = loads(agents, names="hop", clock=clock)
    use(book_loads, book, "h", times=8)
    clock.now += 4 * HALF_LIFE  # 8 requests then are worth a half now
    use(book_loads, book, "o")
    use(book_loads, book, "p")
    await book_loads.ensure(adapter(book, "p"))
    assert agents.sent == [("unload", "r1", "h"), ("load", "r1", "p")]


async def test_a_hot_adapter_is_spread_to_a_replica_with_a_free_slot() -> None:
    agents = Agents([replica("n1", "r1", "a", "b"), replica("n2", "r2", "c")])
    tasks: list[asyncio.Task[None]] = []
    book_loads, book = loads(agents, tasks=tasks)
    use(book_loads, book, "a", times=5)
    book_loads.spread(adapter(book, "a"))
    book_loads.spread(adapter(book, "a"))  # one spread at a time
    assert len(tasks) == 1
    await asyncio.gather(*tasks)
    assert agents.sent == [("load", "r2", "a")]
    assert "a" in agents.nodes[1].shards["r2"].adapters
    # Held everywhere now: nothing more to spread to.
    book_loads.spread(adapter(book, "a"))
    assert len(tasks) == 1


async def test_a_spread_unloads_only_an_idle_adapter_of_lower_value() -> None:
    agents = Agents([replica("n1", "r1", "a", "b"), replica("n2", "r2", "c", "d")])
    tasks: list[asyncio.Task[None]] = []
    book_loads, book = loads(agents, tasks=tasks)
    use(book_loads, book, "a", times=3)
    use(book_loads, book, "c", times=5)
    use(book_loads, book, "d", times=5)
    # Every adapter of r2 is asked for more than a: a is not spread over them.
    book_loads.spread(adapter(book, "a"))
    assert tasks == [] and agents.sent == []
    # d is asked for less than a: it makes room, c (busy or hotter) stays.
    use(book_loads, book, "a", times=4)
    book_loads.started(adapter(book, "c"))
    book_loads.spread(adapter(book, "a"))
    await asyncio.gather(*tasks)
    assert agents.sent == [("unload", "r2", "d"), ("load", "r2", "a")]
    assert sorted(agents.nodes[1].shards["r2"].adapters) == ["a", "c"]


async def test_spreading_leaves_unloaded_adapters_and_standbys_alone() -> None:
    agents = Agents([replica("n1", "r1", "a"), replica("n2", "r2")])
    tasks: list[asyncio.Task[None]] = []
    book_loads, book = loads(agents, tasks=tasks)
    use(book_loads, book, "b", times=5)
    book_loads.spread(adapter(book, "b"))  # held nowhere: `ensure` loads it, not spread
    standby, standby_book = loads(agents, leading=False, tasks=tasks)
    use(standby, standby_book, "a", times=5)
    standby.spread(adapter(standby_book, "a"))
    assert tasks == [] and agents.sent == []


async def test_a_spread_the_engine_refuses_leaves_the_adapter_where_it_was() -> None:
    agents = Agents([replica("n1", "r1", "a"), replica("n2", "r2")], refuse="no room")
    tasks: list[asyncio.Task[None]] = []
    book_loads, book = loads(agents, tasks=tasks)
    use(book_loads, book, "a")
    book_loads.spread(adapter(book, "a"))
    await asyncio.gather(*tasks)  # logged, not raised
    assert agents.sent == [("load", "r2", "a")]
    assert agents.nodes[0].shards["r1"].adapters == ("a",)
    # Another try is allowed once that one ended.
    book_loads.spread(adapter(book, "a"))
    assert len(tasks) == 2
    await asyncio.gather(*tasks)
