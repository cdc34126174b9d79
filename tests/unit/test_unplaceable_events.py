"""An `unplaceable` event is recorded when a model cannot be placed, and again when
the reason changes (not on every reconcile, and not more often than the repeat limit).

A real `Controller`, `Inventory` and `Catalog` stepped by hand in virtual time;
nothing is started (the only node is too small).
"""

from __future__ import annotations

from dashboard_fleet import GIB, ManualClock, _NoDispatch, _NoPlacements, _NoPublish

from llmgw.control.catalog import Catalog
from llmgw.control.catalog.model import CatalogModel, Profile
from llmgw.control.inventory import Inventory
from llmgw.control.inventory.model import GpuInfo, NodeRegistration
from llmgw.control.reconciler.controller import UNPLACEABLE_REPEAT_SECONDS, Controller


def register(inventory: Inventory, node_id: str, gpus: int) -> None:
    inventory.register(
        NodeRegistration(
            node_id=node_id,
            hostname=node_id,
            agent_version="0.1.0",
            gpus=tuple(
                GpuInfo(g, f"GPU-{g}", "NVIDIA L4", 24 * GIB, 23 * GIB) for g in range(gpus)
            ),
            cpu_count=8,
            memory_total=64 * GIB,
            weights_disk_free=100 * GIB,
            gpu_source="declared",
            labels={},
            fabric={},
            running_shards=(),
            port_range=(20000, 20009),
            weights_dir="/w",
        )
    )


def test_a_changed_reason_is_recorded_again() -> None:
    clock = ManualClock()
    inventory = Inventory(
        clock=clock.monotonic, wall_clock=clock.wall, unreachable_after=15.0, lost_after=60.0
    )
    model = CatalogModel(
        name="big",
        weights="org/big",
        profiles=(Profile(name="tp4", engine="sim", gpus=4),),
        min_replicas=1,
        max_replicas=1,
    )
    controller = Controller(
        catalog=Catalog(repo=None, config_models=[model], config_file="llmgw.yaml"),
        inventory=inventory,
        dispatcher=_NoDispatch(),
        placements=_NoPlacements(),
        publisher=_NoPublish(),
        clock=clock.monotonic,
        wall_clock=clock.wall,
        policy="pack",
        interval=1.0,
        retry_base=1.0,
        retry_max=30.0,
        activation_timeout=60.0,
        stop_grace=5.0,
    )

    def unplaceable() -> list[str]:
        return [e.message for e in reversed(controller.events()) if e.kind == "unplaceable"]

    controller.step()
    controller.step()
    assert len(unplaceable()) == 1 and unplaceable()[0].endswith("no nodes registered")

    register(inventory, "node-a", gpus=2)
    controller.step()
    # Changed, but within the repeat limit of the last event: not yet.
    assert len(unplaceable()) == 1
    clock.advance(UNPLACEABLE_REPEAT_SECONDS)
    controller.step()
    controller.step()
    assert len(unplaceable()) == 2
    assert "node-a" in unplaceable()[1] and "no nodes registered" not in unplaceable()[1]

    # The same reason much later: nothing new.
    clock.advance(10 * UNPLACEABLE_REPEAT_SECONDS)
    controller.step()
    assert len(unplaceable()) == 2
