"""What cache-aware routing costs per request, in-process: route + pick, and the shared index.

Builds the balancer as `llmgw server` does (every scorer, the capacity guard) over
N endpoints and times, per request of a chat prompt of `--prompt-bytes`:

- `route + pick`: hashing the prompt's blocks and predicting each endpoint's time
  to first token (the default), with and without the capacity guard (limits asked
  per candidate), and with the weighted scorers (`router.routing.scorers` set);
- the same with the prefix index shared (`router.routing.redis_url`): the request
  path only appends the placement to a list;
- off the request path, per placement: encoding it into a batch for Redis, and on
  another router decoding and applying it to the index; and the bytes sent.

Prints only (nothing is written to bench/RESULTS.md). Not guaranteed: the numbers
are one process on this machine, best of `--rounds` rounds; the router's other
per-request work (HTTP, proxying) is in `router_overhead.py`.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Sequence

import orjson

from llmgw.config.routing import RoutingConfig, ScorerWeights
from llmgw.router.balancer import Balancer, build_scorers
from llmgw.router.endpoints import EjectionPolicy, Endpoint, EndpointSpec
from llmgw.router.requests import CHAT, parse_request
from llmgw.router.scoring.load import LoadBook
from llmgw.router.scoring.prefix import PrefixIndex
from llmgw.router.scoring.share import decode_batch, encode_batch

Publish = Callable[[str, Sequence[int], bool], None]


def make_balancer(
    endpoints: int, publish: Publish | None, capacity: bool = True, weighted: bool = False
) -> tuple[Balancer, list[Endpoint], PrefixIndex]:
    clock = time.monotonic
    routing = RoutingConfig(scorers=ScorerWeights() if weighted else None)
    book = LoadBook(clock=clock, stale_after=5.0)
    index = PrefixIndex(capacity=routing.index_blocks, ttl=routing.index_ttl, clock=clock)
    policy = EjectionPolicy(failure_threshold=3, base=1.0, maximum=8.0)
    eps = [
        Endpoint(EndpointSpec(f"gpu-{i}", f"http://h{i}", ("m",)), policy=policy, clock=clock)
        for i in range(endpoints)
    ]
    balancer = Balancer(
        clock=clock,
        rng=random.Random(0),
        routing=routing,
        scorers=build_scorers(routing, book=book, clock=clock, index=index),
        book=book,
        capacity=(lambda endpoint, model: (None, None)) if capacity else None,
        index=index,
        publish=publish,
    )
    return balancer, eps, index


def bodies(count: int, prompt_bytes: int) -> list[bytes]:
    rng = random.Random(1)
    words = ["river", "cache", "token", "router", "replica", "batch", "stream", "block"]
    system = " ".join(rng.choice(words) for _ in range(prompt_bytes // 7))[:prompt_bytes]
    return [
        orjson.dumps(
            {
                "model": "m",
                "messages": [
                    {"role": "system", "content": f"group {i % 16}. {system}"},
                    {"role": "user", "content": f"question {i}"},
                ],
            }
        )
        for i in range(count)
    ]


def per_request(balancer: Balancer, eps: list[Endpoint], payloads: list[bytes]) -> float:
    requests = [parse_request(CHAT, body) for body in payloads]
    start = time.perf_counter()
    for req in requests:
        balancer.pick(eps, (), balancer.route(req))
    return (time.perf_counter() - start) / len(requests)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt-bytes", type=int, default=20480)
    parser.add_argument("--endpoints", type=int, default=4)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    payloads = bodies(args.requests, args.prompt_bytes)

    bare, plain, weighted, shared = [], [], [], []
    pending: list[tuple[str, Sequence[int], bool]] = []
    for _ in range(args.rounds):
        balancer, eps, _ = make_balancer(args.endpoints, None, capacity=False)
        bare.append(per_request(balancer, eps, payloads))
        balancer, eps, _ = make_balancer(args.endpoints, None)
        plain.append(per_request(balancer, eps, payloads))
        balancer, eps, _ = make_balancer(args.endpoints, None, weighted=True)
        weighted.append(per_request(balancer, eps, payloads))
        pending.clear()
        balancer, eps, _ = make_balancer(args.endpoints, lambda *entry: pending.append(entry))
        shared.append(per_request(balancer, eps, payloads))

    # Off the request path: batches of what one 50 ms interval holds at 1,000 requests/s.
    batch = pending[:50]
    sender = b"01234567"
    encode, apply = [], []
    size = len(encode_batch(sender, batch))
    for _ in range(args.rounds):
        start = time.perf_counter()
        for _ in range(20):
            data = encode_batch(sender, batch)
        encode.append((time.perf_counter() - start) / (20 * len(batch)))
        other, _, _ = make_balancer(args.endpoints, None)
        start = time.perf_counter()
        for _ in range(20):
            for endpoint_id, chain, new in decode_batch(data)[1]:
                other.learn(endpoint_id, chain, new)
        apply.append((time.perf_counter() - start) / (20 * len(batch)))

    def us(values: list[float]) -> str:
        return f"{min(values) * 1e6:,.1f} us (median {statistics.median(values) * 1e6:,.1f})"

    blocks = statistics.mean(len(chain) for _, chain, _ in batch)
    print(f"{args.prompt_bytes}-byte prompts, {args.endpoints} endpoints, best of {args.rounds}:")
    print(f"- route + pick, without the capacity guard: {us(bare)}")
    print(f"- route + pick: {us(plain)}")
    print(f"- route + pick, weighted scorers: {us(weighted)}")
    print(f"- route + pick, index shared: {us(shared)}")
    print(
        f"- per placement, off the request path: encode {us(encode)}, decode + apply {us(apply)}; "
        f"{size / len(batch):,.0f} bytes ({blocks:.0f} blocks)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
