"""Parsing requests of the engine routes: the model of a JSON body or of a multipart form."""

from __future__ import annotations

import random

import httpx
import orjson
import pytest

from llmgw.config.routing import RoutingConfig
from llmgw.router.apis.engine_routes import MultipartRequest, parse
from llmgw.router.balancer import Balancer, build_scorers
from llmgw.router.errors import InvalidJSON, InvalidRequest
from llmgw.router.requests import parse_request
from llmgw.router.scoring.load import LoadBook
from llmgw.sim.extras import detokenize, overlap, token_id, token_text, transcript

AUDIO = "/v1/audio/transcriptions"


def _form(
    fields: dict[str, str], file: bytes | None = b"RIFF\x00\x01\r\n--x\r\n"
) -> tuple[bytes, bytes]:
    files = {"file": ("a.wav", file, "audio/wav")} if file is not None else None
    request = httpx.Request("POST", "http://x/", data=fields, files=files)
    return request.read(), request.headers["content-type"].encode()


def test_a_json_route_is_routed_by_its_model_and_sent_as_it_came() -> None:
    raw = b'{"model": "m",  "query": "q", "documents": ["a"]}'
    req = parse("/v1/rerank", raw, b"application/json")
    assert (req.path, req.model, req.stream) == ("/v1/rerank", "m", False)
    assert req.upstream_body is raw
    assert req.content_type == b"application/json"


@pytest.mark.parametrize(
    ("raw", "param"),
    [(b'{"prompt": "x"}', "model"), (b'{"model": ""}', "model"), (b"[1]", None)],
)
def test_a_json_route_without_a_model_is_refused(raw: bytes, param: str | None) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse("/tokenize", raw, None)
    assert caught.value.param == param
    assert caught.value.status == 400


def test_a_json_route_with_broken_json_is_refused() -> None:
    with pytest.raises(InvalidJSON):
        parse("/v1/score", b"{", b"application/json")


def test_a_multipart_model_is_found_and_the_body_kept_byte_for_byte() -> None:
    raw, content_type = _form({"model": "whisper", "language": "en"})
    req = parse(AUDIO, raw, content_type)
    assert isinstance(req, MultipartRequest)
    assert req.model == "whisper"
    assert req.upstream_body is raw
    assert req.content_type == content_type
    assert not req.stream


def test_an_alias_is_rewritten_in_place_in_a_multipart_body() -> None:
    raw, content_type = _form({"model": "short", "prompt": "model"})
    req = parse(AUDIO, raw, content_type)
    req.send_as("a-much-longer-engine-name")
    assert req.upstream_body == raw.replace(
        b'name="model"\r\n\r\nshort', b'name="model"\r\n\r\na-much-longer-engine-name'
    )
    again = parse(AUDIO, req.upstream_body, content_type)
    assert again.model == "a-much-longer-engine-name"


def test_a_multipart_stream_field_marks_the_request_streamed() -> None:
    raw, content_type = _form({"model": "m", "stream": "true"})
    req = parse(AUDIO, raw, content_type)
    assert req.stream
    # The client asks for the usage chunk itself; the relay must not strip it.
    assert req.client_wants_usage


def test_a_quoted_boundary_is_understood() -> None:
    raw, content_type = _form({"model": "m"})
    boundary = content_type.split(b"boundary=")[1]
    quoted = b'multipart/form-data; charset=utf-8; boundary="' + boundary + b'"'
    assert parse(AUDIO, raw, quoted).model == "m"


def test_a_multipart_body_without_a_model_names_the_field() -> None:
    raw, content_type = _form({"language": "en"})
    with pytest.raises(InvalidRequest) as caught:
        parse(AUDIO, raw, content_type)
    assert caught.value.param == "model"
    assert "form field" in caught.value.message


@pytest.mark.parametrize(
    ("content_type", "words"),
    [
        (b"application/json", "must be multipart/form-data"),
        (None, "got content type none"),
        (b"multipart/form-data", "has no boundary"),
        (b"multipart/form-data; boundary=zzz", "boundary of its content type is not in it"),
    ],
)
def test_a_body_that_is_not_multipart_is_refused(content_type: bytes | None, words: str) -> None:
    raw, _ = _form({"model": "m"})
    with pytest.raises(InvalidRequest, match=words):
        parse(AUDIO, raw, content_type)


def test_a_cut_off_multipart_body_is_refused() -> None:
    raw, content_type = _form({"model": "m"})
    with pytest.raises(InvalidRequest, match="closing boundary"):
        parse(AUDIO, raw[:-10], content_type)
    head_only = raw[: raw.index(b"\r\n\r\n")]
    with pytest.raises(InvalidRequest, match="headers do not end"):
        parse(AUDIO, head_only, content_type)


def test_sim_token_ids_round_trip_short_tokens_and_hash_long_ones() -> None:
    ids = [token_id(t) for t in ["Hello", ",", "big", "world"]]
    assert detokenize(ids) == "Hello, big world"
    long_id = token_id("mountainous")
    assert long_id < 2**63
    assert token_text(long_id) == "<unk>"
    assert token_id("mountainous") == long_id
    with pytest.raises(ValueError, match="not a token id"):
        token_text(-1)


def test_sim_scores_and_transcripts_are_deterministic() -> None:
    assert overlap("Blue river", "the blue RIVER") == 2 / 3
    assert overlap("", "") == 0.0
    text, seconds = transcript(b"\x00" * 64_000)
    assert seconds == 2.0
    assert len(text.split()) == 5
    assert transcript(b"\x00" * 64_000) == (text, seconds)
    assert transcript(b"\x00" * 64_000, salt=1)[0] != text


def test_engine_route_prompts_are_not_hashed_for_prefix_routing() -> None:
    routing = RoutingConfig()
    book = LoadBook(clock=lambda: 0.0, stale_after=5.0)
    balancer = Balancer(
        clock=lambda: 0.0,
        rng=random.Random(0),
        routing=routing,
        scorers=build_scorers(routing, book=book, clock=lambda: 0.0),
        book=book,
    )
    prompt = "You are a careful assistant. " * 200
    completion = parse_request("/v1/completions", orjson.dumps({"model": "m", "prompt": prompt}))
    assert balancer.route(completion).blocks
    tokenize = parse("/tokenize", orjson.dumps({"model": "m", "prompt": prompt}), None)
    # A tokenizer call fills no cache: it must not make a replica look warm for the prompt.
    assert balancer.route(tokenize).blocks == []


def test_vllms_prompt_is_renamed_only_for_llamacpps_tokenizer() -> None:
    req = parse("/tokenize", b'{"model": "m", "prompt": "hi", "add_special": true}', None)
    assert req.body_for("/tokenize") is req.upstream_body
    assert orjson.loads(req.body_for("/extras/tokenize")) == {
        "model": "m",
        "input": "hi",
        "add_special": True,
    }
    both = parse("/tokenize", b'{"model": "m", "prompt": "a", "input": "b"}', None)
    assert both.body_for("/extras/tokenize") is both.upstream_body
