"""Which routes each engine serves, and how endpoints learn them (config, control plane)."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from llmgw.cli.control_wiring import replica_spec, static_spec
from llmgw.config import ConfigError, EndpointConfig, load_server_config
from llmgw.config.server import EndpointRoute, EngineName
from llmgw.control.catalog.model import CatalogModel
from llmgw.control.catalog.validate import parse_model
from llmgw.control.reconciler.controller import _with_engine
from llmgw.control.reconciler.state import ReadyEndpoint
from llmgw.engines import KNOWN_ENGINES, EngineSettings, UnknownEngine, adapter_for, routes_of
from llmgw.engines.routes import ALL_ROUTES, OPENAI_ROUTES
from llmgw.router.endpoints import EjectionPolicy, Endpoint


def test_config_names_the_same_engines_and_routes_as_the_engines_package() -> None:
    assert get_args(EngineName) == KNOWN_ENGINES
    assert get_args(EndpointRoute) == ALL_ROUTES


@pytest.mark.parametrize("engine", KNOWN_ENGINES)
def test_every_engine_serves_the_openai_routes_under_their_own_paths(engine: str) -> None:
    routes = routes_of(engine)
    assert routes == adapter_for(engine, settings=EngineSettings(python="python3")).routes
    for route in OPENAI_ROUTES:
        assert routes[route] == route
    assert set(routes) <= set(ALL_ROUTES)


def test_llamacpp_tokenizes_under_extras_and_serves_no_rerank_or_audio() -> None:
    routes = routes_of("llamacpp")
    assert routes["/tokenize"] == "/extras/tokenize"
    assert routes["/detokenize"] == "/extras/detokenize"
    assert "/v1/rerank" not in routes
    assert "/v1/audio/transcriptions" not in routes


def test_vllm_and_sim_serve_every_engine_route_sglang_no_audio() -> None:
    assert set(routes_of("vllm")) == set(ALL_ROUTES)
    assert set(routes_of("sim")) == set(ALL_ROUTES)
    assert "/v1/rerank" in routes_of("sglang")
    assert "/v1/audio/transcriptions" not in routes_of("sglang")


def test_an_unknown_engine_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(UnknownEngine, match="vllm"):
        routes_of("tgi")


def _endpoint(**fields: object) -> Endpoint:
    config = EndpointConfig.model_validate(
        {"id": "e1", "url": "http://127.0.0.1:9", "models": ["m"], **fields}
    )
    return Endpoint(static_spec(config), policy=EjectionPolicy(3, 1.0, 10.0), clock=lambda: 0.0)


def test_a_static_endpoint_without_engine_passes_every_route_as_it_comes() -> None:
    endpoint = _endpoint()
    assert endpoint.engine == ""
    assert endpoint.path_for("/v1/rerank") == "/v1/rerank"
    assert endpoint.path_for("/tokenize") == "/tokenize"


def test_a_static_endpoint_names_its_parsers_so_thoughts_and_calls_can_be_continued() -> None:
    # Parsers whose markup the engine's adapter writes back: continued.
    endpoint = _endpoint(engine="vllm", reasoning_parser="qwen3", tool_call_parser="hermes")
    assert (endpoint.thoughts, endpoint.tool_calls) == (True, True)
    # SGLang names its parsers its own way; a parser whose markup llmgw does not write
    # (mistral) or none named: not continued.
    assert _endpoint(engine="sglang", tool_call_parser="qwen25").tool_calls
    assert not _endpoint(engine="sglang", tool_call_parser="hermes").tool_calls
    assert not _endpoint(engine="vllm", tool_call_parser="mistral").tool_calls
    plain = _endpoint(engine="vllm")
    assert (plain.thoughts, plain.tool_calls) == (False, False)


def test_an_endpoint_parser_without_an_engine_is_a_config_error_naming_the_field(
    tmp_path: Path,
) -> None:
    path = tmp_path / "llmgw.yaml"
    path.write_text(
        "endpoints:\n  - {id: e1, url: 'http://127.0.0.1:9', models: [m], "
        "reasoning_parser: deepseek_r1}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_server_config(path, {})
    message = str(info.value)
    assert str(path) in message and "endpoints[0]" in message
    assert "reasoning_parser is set but engine is not" in message
    path.write_text(
        "endpoints:\n  - {id: e1, url: 'http://127.0.0.1:9', models: [m], engine: vllm, "
        "tool_call_parser: ''}\n"
    )
    with pytest.raises(ConfigError, match="tool_call_parser"):
        load_server_config(path, {})


def test_a_static_endpoint_gets_its_engines_routes_and_paths() -> None:
    endpoint = _endpoint(engine="llamacpp")
    assert endpoint.path_for("/tokenize") == "/extras/tokenize"
    assert endpoint.path_for("/v1/rerank") is None
    assert endpoint.path_for("/v1/chat/completions") == "/v1/chat/completions"
    assert endpoint.describe(0.0)["engine"] == "llamacpp"


def test_declared_routes_narrow_the_engines_and_keep_its_paths() -> None:
    endpoint = _endpoint(engine="llamacpp", routes=["/v1/embeddings", "/tokenize", "/v1/rerank"])
    assert endpoint.path_for("/tokenize") == "/extras/tokenize"
    # Declared, though llmgw does not know llama.cpp to serve it: its own path.
    assert endpoint.path_for("/v1/rerank") == "/v1/rerank"
    assert endpoint.path_for("/v1/chat/completions") is None
    assert endpoint.describe(0.0)["routes"] == ["/tokenize", "/v1/embeddings", "/v1/rerank"]


def _load(tmp_path: Path, endpoint: str) -> None:
    path = tmp_path / "llmgw.yaml"
    path.write_text(
        "endpoints:\n  - id: gpu1\n    url: http://127.0.0.1:8000\n    models: [m]\n" + endpoint
    )
    load_server_config(path, {})


def test_a_bad_engine_name_is_a_config_error_naming_file_and_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, "    engine: llama.cpp\n")
    message = str(caught.value)
    assert f"{tmp_path / 'llmgw.yaml'}: endpoints[0].engine:" in message
    assert "'llamacpp'" in message


def test_an_unknown_route_is_a_config_error_naming_file_and_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, "    routes: [/v1/rerank, /v1/moderations]\n")
    message = str(caught.value)
    assert "endpoints[0].routes[1]:" in message
    assert "'/v1/rerank'" in message


def test_an_empty_route_list_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"endpoints\[0\]\.routes: must name at least one"):
        _load(tmp_path, "    routes: []\n")


def test_a_replica_gets_the_routes_of_its_engine() -> None:
    spec = replica_spec(ReadyEndpoint("r1", "http://10.0.0.1:8000", "llamacpp"), ("m",))
    assert spec.engine == "llamacpp"
    assert dict(spec.routes or ()) == dict(routes_of("llamacpp"))
    unknown = replica_spec(ReadyEndpoint("r2", "http://10.0.0.1:8001"), ("m",))
    assert unknown.routes is None


def _model(*engines: str) -> CatalogModel:
    return parse_model(
        {
            "name": "m",
            "weights": "/w/m.gguf",
            "profiles": [{"name": f"p{i}", "engine": e, "gpus": 1} for i, e in enumerate(engines)],
        }
    )


def test_a_standby_names_the_engine_from_the_catalog_when_the_profiles_agree() -> None:
    bare = [ReadyEndpoint("r1", "http://a:1")]
    assert [e.engine for e in _with_engine(_model("llamacpp"), bare)] == ["llamacpp"]
    assert [e.engine for e in _with_engine(_model("vllm", "sglang"), bare)] == [""]
    named = [ReadyEndpoint("r1", "http://a:1", "vllm")]
    assert [e.engine for e in _with_engine(_model("sglang"), named)] == ["vllm"]
