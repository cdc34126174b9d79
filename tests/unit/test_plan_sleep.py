"""`plan()` with sleeping replicas: they count as replicas, and their GPUs are free for
another model's replica once they are stopped (`make_room`)."""

from __future__ import annotations

from test_plan import make_model, make_node, make_shard, run

from llmgw.control.reconciler import Desired, Start, Stop


def test_a_sleeping_replica_counts_so_nothing_else_starts_for_its_model() -> None:
    node = make_node("n1", gpus=2, shards=[make_shard("a-1", "a", gpus=(0,), state="sleeping")])
    result = run([Desired(make_model("a"), 1)], [node])
    assert result.actions == ()
    assert result.unplaced == {}


def test_keep_alive_stops_a_sleeping_replica_like_any_other() -> None:
    node = make_node("n1", gpus=2, shards=[make_shard("a-1", "a", gpus=(0,), state="sleeping")])
    (stop,) = run([Desired(make_model("a"), 0)], [node]).actions
    assert isinstance(stop, Stop)
    assert (stop.shard_id, stop.reason) == ("a-1", "scale_down")


def test_a_sleeping_replica_whose_gpus_are_needed_is_stopped_first() -> None:
    asleep = make_shard("a-1", "a", gpus=(0, 1), state="sleeping")
    node = make_node("n1", gpus=2, shards=[asleep])
    result = run([Desired(make_model("a", gpus=2), 1), Desired(make_model("b"), 1)], [node])
    (stop,) = result.actions
    assert isinstance(stop, Stop)
    assert (stop.shard_id, stop.reason, stop.drain) == ("a-1", "make_room", False)
    assert "model b needs its GPUs" in stop.detail
    # Not unplaceable: the start comes once the GPUs are free.
    assert result.unplaced == {}

    # While it stops, b waits (no second stop, still not unplaceable); a, idle past its
    # sleep_after, is on hold (the controller's `dozing`) and not started elsewhere...
    waiting = run(
        [Desired(make_model("a", gpus=2), 1, hold=True), Desired(make_model("b"), 1)],
        [node],
        stopping=frozenset({"a-1"}),
    )
    assert waiting.actions == () and waiting.unplaced == {}
    # ...and is placed once it is gone.
    gone = make_node("n1", gpus=2, shards=[make_shard("a-1", "a", gpus=(0, 1), state="stopped")])
    placed = [a for a in run([Desired(make_model("b"), 1)], [gone]).actions if isinstance(a, Start)]
    assert [a.model for a in placed] == ["b"]


def test_a_ready_replica_is_never_stopped_to_make_room() -> None:
    node = make_node("n1", gpus=1, shards=[make_shard("a-1", "a", gpus=(0,))])
    result = run([Desired(make_model("a"), 1), Desired(make_model("b"), 1)], [node])
    assert result.actions == ()
    assert "b" in result.unplaced
