"""Fault settings: validation, partial updates, the crash countdown and the error draw."""

from __future__ import annotations

import random
from typing import NoReturn

import pytest

from llmgw.sim.faults import Faults, FaultsError, FaultSettings


class Exited(Exception):
    pass


def _exit(code: int) -> NoReturn:
    raise Exited(code)


def _faults(**settings: object) -> Faults:
    return Faults(
        settings=FaultSettings.model_validate(settings), rng=random.Random(0), exit_process=_exit
    )


def test_updates_merge_into_the_current_settings() -> None:
    faults = _faults(error_status=503)
    settings = faults.update({"error_rate": 0.5})
    assert settings.error_rate == 0.5
    assert settings.error_status == 503
    assert faults.settings is settings


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"error_rate": 1.5}, "error_rate"),
        ({"error_status": 200}, "error_status"),
        ({"crash_after": -1}, "crash_after"),
        ({"slow_start": "soon"}, "slow_start"),
        ({"stall_after_tokens": True}, "stall_after_tokens"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_invalid_updates_name_the_field_and_change_nothing(
    patch: dict[str, object], field: str
) -> None:
    faults = _faults()
    before = faults.settings
    with pytest.raises(FaultsError, match=field):
        faults.update(patch)
    assert faults.settings is before


def test_crash_after_n_exits_when_request_n_plus_one_arrives() -> None:
    faults = _faults(crash_after=2)
    faults.on_inference_request()
    faults.on_inference_request()
    with pytest.raises(Exited):
        faults.on_inference_request()


def test_setting_crash_after_restarts_the_count() -> None:
    faults = _faults()
    for _ in range(5):
        faults.on_inference_request()
    faults.update({"crash_after": 1})
    faults.on_inference_request()
    with pytest.raises(Exited):
        faults.on_inference_request()


def test_error_rate_extremes_and_a_fraction() -> None:
    assert not any(_faults(error_rate=0.0).should_fail() for _ in range(100))
    assert all(_faults(error_rate=1.0).should_fail() for _ in range(100))
    faults = _faults(error_rate=0.3)
    failures = sum(faults.should_fail() for _ in range(1000))
    assert 200 < failures < 400
