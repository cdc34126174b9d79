"""Which client APIs each engine serves natively, and relaying a native stream."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from llmgw.cli.control_wiring import replica_spec
from llmgw.control.catalog.model import CatalogModel
from llmgw.control.catalog.validate import parse_model
from llmgw.control.reconciler.controller import _with_engine
from llmgw.control.reconciler.state import ReadyEndpoint
from llmgw.engines import EngineSpec, ProfileError, SimAdapter, UnknownEngine, native_apis_of
from llmgw.engines.spec import EngineSettings
from llmgw.router.apis.messages import MessagesApi
from llmgw.router.apis.responses import ResponsesApi
from llmgw.router.errors import InvalidRequest
from llmgw.router.sse import NativeRelay
from llmgw.router.usage_scan import usages_in


def test_each_engine_kind_declares_its_native_apis() -> None:
    assert native_apis_of("vllm", ()) == {"messages", "responses"}
    assert native_apis_of("sglang", ()) == {"responses"}
    assert native_apis_of("llamacpp", ()) == frozenset()
    assert native_apis_of("sim", ()) == frozenset()
    assert native_apis_of("sim", ("--native-apis", "messages")) == {"messages"}
    assert native_apis_of("sim", ("--zero-delay", "--native-apis=responses,messages")) == {
        "messages",
        "responses",
    }
    with pytest.raises(UnknownEngine):
        native_apis_of("tgi", ())


def test_a_sim_profile_with_an_unknown_api_is_refused_naming_the_field() -> None:
    adapter = SimAdapter(settings=EngineSettings(python="python3"))
    spec = EngineSpec(
        shard_id="s",
        model="m",
        engine="sim",
        weights="",
        port=8000,
        engine_args=("--native-apis", "messages,chat"),
    )
    with pytest.raises(ProfileError) as refused:
        adapter.validate(spec)
    assert refused.value.field == "engine_args"
    assert "'chat'" in refused.value.message and "--native-apis" in refused.value.message
    ok = EngineSpec(
        shard_id="s",
        model="m",
        engine="sim",
        weights="",
        port=8000,
        engine_args=("--native-apis", "messages"),
    )
    assert "--native-apis" in adapter.plan(ok).argv


def test_a_placed_replica_reaches_the_router_with_its_engines_native_apis() -> None:
    sim = ReadyEndpoint("r1", "http://10.0.0.1:8000", "sim", ("--native-apis", "responses"))
    assert replica_spec(sim, ("m",)).native_apis == {"responses"}
    vllm = ReadyEndpoint("r2", "http://10.0.0.2:8000", "vllm")
    assert replica_spec(vllm, ("m",)).native_apis == {"messages", "responses"}
    unknown = ReadyEndpoint("r3", "http://10.0.0.3:8000")
    assert replica_spec(unknown, ("m",)).native_apis == frozenset()


STREAM = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1",'
    b'"content":[],"usage":{"input_tokens":12,"output_tokens":0}}}\n\n'
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":"usage: {not json"}}\n\n'
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
    b'"usage":{"output_tokens":30}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)


@pytest.mark.parametrize("size", [1, 7, 64, len(STREAM)])
def test_a_native_stream_passes_through_byte_for_byte_and_its_usage_is_read(size: int) -> None:
    relay = NativeRelay()
    out = b"".join(relay.feed(STREAM[i : i + size]) for i in range(0, len(STREAM), size))
    out += relay.finish(prompt_tokens_estimate=999)
    assert out == STREAM
    assert relay.usage == {"input_tokens": 12, "output_tokens": 30}
    assert relay.counted == 30


def test_usages_in_reads_every_usage_object_in_order() -> None:
    data = (
        b'{"response":{"usage":null}}{"usage":{"input_tokens":3,'
        b'"input_tokens_details":{"cached_tokens":1}}}{"usage": {"output_tokens":4}}'
    )
    assert usages_in(data) == [
        {"input_tokens": 3, "input_tokens_details": {"cached_tokens": 1}},
        {"output_tokens": 4},
    ]


async def test_a_native_answer_passes_through_and_a_router_error_takes_the_apis_shape() -> None:
    api = MessagesApi()
    req = api.parse(b'{"model":"m","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}')
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(dict(message))

    responder = api.responder(req, send)
    req.served_natively = True
    start = {
        "type": "http.response.start",
        "status": 200,
        "headers": [(b"content-type", b"text/event-stream")],
    }
    await responder(start)
    await responder({"type": "http.response.body", "body": STREAM[:120], "more_body": True})
    error = b'event: error\ndata: {"error":{"message":"stream stalled","type":"timeout_error"}}\n\n'
    await responder({"type": "http.response.body", "body": error, "more_body": False})
    assert sent[0] == start and sent[1]["body"] == STREAM[:120]
    assert sent[2]["body"].startswith(b"event: error\ndata: ")
    payload = orjson.loads(sent[2]["body"].split(b"data: ", 1)[1])
    assert payload == {
        "type": "error",
        "error": {"type": "timeout_error", "message": "stream stalled"},
    }


def test_a_body_only_a_native_engine_can_carry_keeps_the_translations_error() -> None:
    req = ResponsesApi().parse(b'{"model":"m","input":"hi","previous_response_id":"resp_1"}')
    assert req.native is not None and req.native.required is not None
    assert req.native.required.param == "previous_response_id"
    assert req.native.body == b'{"model":"m","input":"hi","previous_response_id":"resp_1"}'
    with pytest.raises(InvalidRequest) as refused:
        ResponsesApi().parse(b'{"input":"hi","store":true}')
    assert refused.value.param == "model"


def _sim_model(*engine_args: list[str]) -> CatalogModel:
    profiles = [
        {"name": f"p{i}", "engine": "sim", "gpus": 1, "engine_args": args}
        for i, args in enumerate(engine_args)
    ]
    return parse_model({"name": "m", "weights": "none", "profiles": profiles})


def test_a_standby_takes_the_native_apis_from_the_profiles_when_they_agree() -> None:
    bare = [ReadyEndpoint("r1", "http://a:1")]
    [same] = _with_engine(_sim_model(["--native-apis", "messages"]), bare)
    assert replica_spec(same, ("m",)).native_apis == {"messages"}
    [differ] = _with_engine(_sim_model(["--native-apis", "messages"], []), bare)
    assert replica_spec(differ, ("m",)).native_apis == frozenset()
