"""GPU discovery: NVML through a fake of the pynvml functions (there are no GPUs here),
declared GPUs, none; and the machine report."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmgw.agent.hardware import (
    DeclaredGpus,
    GpuInfo,
    GpuUsage,
    Hardware,
    NoGpus,
    NvmlGpus,
    discover_gpus,
    load_nvml,
)

GIB = 2**30


class NVMLError(Exception):
    pass


@dataclass
class Memory:
    total: int
    free: int
    used: int


@dataclass
class Utilization:
    gpu: int
    memory: int


@dataclass
class FakeDevice:
    uuid: str | bytes
    name: str | bytes
    total: int
    used: int
    util: int
    broken: bool = False


class FakeNvml:
    """The pynvml functions the agent calls, over a list of fake devices."""

    NVMLError = NVMLError

    def __init__(self, devices: list[FakeDevice], *, init_error: str | None = None) -> None:
        self.devices = devices
        self.init_error = init_error
        self.initialised = False
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        assert self.initialised
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        return self.devices[index]

    def nvmlDeviceGetUUID(self, handle: object) -> str | bytes:
        assert isinstance(handle, FakeDevice)
        return handle.uuid

    def nvmlDeviceGetName(self, handle: object) -> str | bytes:
        assert isinstance(handle, FakeDevice)
        return handle.name

    def nvmlDeviceGetMemoryInfo(self, handle: object) -> Memory:
        assert isinstance(handle, FakeDevice)
        if handle.broken:
            raise NVMLError("GPU is lost")
        return Memory(total=handle.total, free=handle.total - handle.used, used=handle.used)

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> Utilization:
        assert isinstance(handle, FakeDevice)
        return Utilization(gpu=handle.util, memory=0)


def h100(i: int, *, used: int = 0, util: int = 0) -> FakeDevice:
    return FakeDevice(
        uuid=f"GPU-{i:04d}", name="NVIDIA H100 80GB HBM3", total=80 * GIB, used=used, util=util
    )


def test_nvml_inventory_and_usage() -> None:
    nvml = FakeNvml([h100(0, used=10 * GIB, util=37), h100(1)])
    gpus = discover_gpus(nvml=nvml, declared=(), node_id="n")
    assert isinstance(gpus, NvmlGpus) and gpus.source == "nvml"
    assert gpus.inventory() == (
        GpuInfo(0, "GPU-0000", "NVIDIA H100 80GB HBM3", 80 * GIB, 70 * GIB),
        GpuInfo(1, "GPU-0001", "NVIDIA H100 80GB HBM3", 80 * GIB, 80 * GIB),
    )
    assert gpus.usage() == (
        GpuUsage(0, 37.0, 10 * GIB, 70 * GIB),
        GpuUsage(1, 0.0, 0, 80 * GIB),
    )
    gpus.close()
    assert nvml.shutdowns == 1


def test_nvml_wins_over_declared_gpus_and_old_bytes_names_decode() -> None:
    device = FakeDevice(uuid=b"GPU-abc", name=b"Tesla V100", total=16 * GIB, used=0, util=5)
    gpus = discover_gpus(nvml=FakeNvml([device]), declared=(24 * GIB,), node_id="n")
    assert gpus.source == "nvml"
    assert gpus.inventory() == (GpuInfo(0, "GPU-abc", "Tesla V100", 16 * GIB, 16 * GIB),)


def test_an_unreadable_gpu_is_left_out_not_fatal() -> None:
    broken = h100(1)
    broken.broken = True
    gpus = discover_gpus(nvml=FakeNvml([h100(0), broken]), declared=(), node_id="n")
    assert [g.index for g in gpus.inventory()] == [0]
    assert [u.index for u in gpus.usage()] == [0]


def test_no_nvml_library_falls_back_to_declared_gpus() -> None:
    nvml = FakeNvml([], init_error="NVML Shared Library Not Found")
    gpus = discover_gpus(nvml=nvml, declared=(24 * GIB, 24 * GIB), node_id="node-a")
    assert isinstance(gpus, DeclaredGpus) and gpus.source == "declared"
    assert gpus.inventory() == (
        GpuInfo(0, "declared-node-a-0", "declared", 24 * GIB, 24 * GIB),
        GpuInfo(1, "declared-node-a-1", "declared", 24 * GIB, 24 * GIB),
    )
    assert gpus.usage() == ()


def test_nvml_without_devices_uses_declared_or_none_and_shuts_nvml_down() -> None:
    nvml = FakeNvml([])
    assert discover_gpus(nvml=nvml, declared=(GIB,), node_id="n").source == "declared"
    assert nvml.shutdowns == 1 and not nvml.initialised
    assert isinstance(discover_gpus(nvml=FakeNvml([]), declared=(), node_id="n"), NoGpus)


def test_no_pynvml_at_all_and_nothing_declared_means_none() -> None:
    gpus = discover_gpus(nvml=None, declared=(), node_id="n")
    assert gpus.source == "none" and gpus.inventory() == () and gpus.usage() == ()


def test_the_real_pynvml_module_loads_and_fails_cleanly_without_a_driver() -> None:
    nvml = load_nvml()
    assert nvml is not None  # nvidia-ml-py is a dependency
    gpus = discover_gpus(nvml=nvml, declared=(8 * GIB,), node_id="n")
    if shutil.which("nvidia-smi") is None:
        assert gpus.source == "declared"
    gpus.close()


async def test_machine_report(tmp_path: Path) -> None:
    hardware = Hardware(
        gpus=DeclaredGpus(node_id="n", memory_bytes=(24 * GIB,)), weights_dir=tmp_path
    )
    report = await hardware.report()
    assert report.gpu_source == "declared" and len(report.gpus) == 1
    assert report.cpu_count == len(os.sched_getaffinity(0))
    assert report.memory_total_bytes > GIB
    assert 0 < report.weights_disk_free_bytes <= shutil.disk_usage(tmp_path).total
    assert await hardware.usage() == ()


async def test_machine_report_with_a_vanished_weights_dir(tmp_path: Path) -> None:
    hardware = Hardware(gpus=NoGpus(), weights_dir=tmp_path / "gone")
    assert (await hardware.report()).weights_disk_free_bytes == 0


@pytest.mark.parametrize("count", [1, 8])
def test_declared_uuids_are_stable_and_unique(count: int) -> None:
    gpus = DeclaredGpus(node_id="x", memory_bytes=(GIB,) * count).inventory()
    assert len({g.uuid for g in gpus}) == count
    assert gpus == DeclaredGpus(node_id="x", memory_bytes=(GIB,) * count).inventory()
