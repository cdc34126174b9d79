"""What this node has: GPUs (from NVML, or declared on the command line), CPUs,
memory and free disk for weights.

NVML (the `pynvml` module of nvidia-ml-py) is the source of truth when it loads;
on machines without an NVIDIA driver the agent falls back to the GPUs declared
with `--gpus` (for tests and demos), or to none. Every NVML and disk call is
blocking, so the async methods run them in a worker thread.

Not guaranteed: declared GPUs are taken on trust (nothing checks they exist, and
their free memory is reported as their total); NVML figures are a snapshot.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, cast

log = logging.getLogger("llmgw.agent.hardware")


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One GPU as placement sees it."""

    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_free_bytes: int


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """One GPU's load at heartbeat time."""

    index: int
    utilization_percent: float
    memory_used_bytes: int
    memory_free_bytes: int


@dataclass(frozen=True, slots=True)
class HostUsage:
    """The weights disk and host memory at heartbeat time; 0 totals: not readable."""

    disk_total_bytes: int
    disk_free_bytes: int
    memory_total_bytes: int
    memory_available_bytes: int


@dataclass(frozen=True, slots=True)
class HardwareReport:
    """Everything Register says about the machine."""

    gpus: tuple[GpuInfo, ...]
    cpu_count: int
    memory_total_bytes: int
    weights_disk_free_bytes: int
    gpu_source: str  # "nvml" | "declared" | "none"


class _NvmlMemory(Protocol):
    total: int
    free: int
    used: int


class _NvmlUtilization(Protocol):
    gpu: int
    memory: int


class NvmlApi(Protocol):
    """The part of the `pynvml` module the agent uses (a fake of it in unit tests)."""

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> object: ...
    def nvmlDeviceGetUUID(self, handle: object) -> str | bytes: ...
    def nvmlDeviceGetName(self, handle: object) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: object) -> _NvmlMemory: ...
    def nvmlDeviceGetUtilizationRates(self, handle: object) -> _NvmlUtilization: ...


class GpuSource(Protocol):
    """Where GPU facts come from. Both methods block; call them in a thread."""

    @property
    def source(self) -> str: ...
    def inventory(self) -> tuple[GpuInfo, ...]: ...
    def usage(self) -> tuple[GpuUsage, ...]: ...
    def close(self) -> None: ...


def load_nvml() -> NvmlApi | None:
    """The `pynvml` module, or None when nvidia-ml-py is not installed."""
    try:
        module = importlib.import_module("pynvml")
    except ImportError:
        return None
    return cast(NvmlApi, module)


def _text(value: str | bytes) -> str:
    # Older pynvml releases return bytes, newer ones str.
    return value.decode(errors="replace") if isinstance(value, bytes) else value


class NvmlGpus:
    """GPUs read from NVML; the library stays initialised until `close()`."""

    source = "nvml"

    def __init__(self, api: NvmlApi, count: int) -> None:
        self._api = api
        self._handles = tuple(api.nvmlDeviceGetHandleByIndex(i) for i in range(count))

    def inventory(self) -> tuple[GpuInfo, ...]:
        gpus = []
        for index, handle in enumerate(self._handles):
            try:
                memory = self._api.nvmlDeviceGetMemoryInfo(handle)
                gpu = GpuInfo(
                    index=index,
                    uuid=_text(self._api.nvmlDeviceGetUUID(handle)),
                    name=_text(self._api.nvmlDeviceGetName(handle)),
                    memory_total_bytes=int(memory.total),
                    memory_free_bytes=int(memory.free),
                )
            except self._api.NVMLError as exc:
                # A GPU NVML cannot read is not offered for placement.
                log.warning("NVML cannot read GPU %d; not reporting it: %s", index, exc)
                continue
            gpus.append(gpu)
        return tuple(gpus)

    def usage(self) -> tuple[GpuUsage, ...]:
        samples = []
        for index, handle in enumerate(self._handles):
            try:
                memory = self._api.nvmlDeviceGetMemoryInfo(handle)
                rates = self._api.nvmlDeviceGetUtilizationRates(handle)
            except self._api.NVMLError as exc:
                # One GPU that fell off the bus must not stop the heartbeat.
                log.warning("NVML cannot read GPU %d: %s", index, exc)
                continue
            samples.append(
                GpuUsage(
                    index=index,
                    utilization_percent=float(rates.gpu),
                    memory_used_bytes=int(memory.used),
                    memory_free_bytes=int(memory.free),
                )
            )
        return tuple(samples)

    def close(self) -> None:
        try:
            self._api.nvmlShutdown()
        except self._api.NVMLError as exc:
            log.debug("nvmlShutdown: %s", exc)


class DeclaredGpus:
    """GPUs given with `--gpus` on a machine without NVML; no usage figures."""

    source = "declared"

    def __init__(self, *, node_id: str, memory_bytes: Sequence[int]) -> None:
        self._gpus = tuple(
            GpuInfo(
                index=i,
                uuid=f"declared-{node_id}-{i}",
                name="declared",
                memory_total_bytes=size,
                memory_free_bytes=size,
            )
            for i, size in enumerate(memory_bytes)
        )

    def inventory(self) -> tuple[GpuInfo, ...]:
        return self._gpus

    def usage(self) -> tuple[GpuUsage, ...]:
        return ()

    def close(self) -> None:
        """Nothing to release: no driver handle is held."""


class NoGpus:
    """A CPU-only node."""

    source = "none"

    def inventory(self) -> tuple[GpuInfo, ...]:
        return ()

    def usage(self) -> tuple[GpuUsage, ...]:
        return ()

    def close(self) -> None:
        """Nothing to release: no driver handle is held."""


def discover_gpus(
    *, nvml: NvmlApi | None, declared: Sequence[int], node_id: str
) -> NvmlGpus | DeclaredGpus | NoGpus:
    """NVML when it initialises and sees at least one GPU, else the declared GPUs, else none.

    Blocking (NVML initialisation can take a second); call it in a thread.
    """
    if nvml is not None:
        try:
            nvml.nvmlInit()
        except (nvml.NVMLError, OSError) as exc:
            log.info("NVML unavailable (%s); using %s", exc, "--gpus" if declared else "no GPUs")
        else:
            try:
                count = nvml.nvmlDeviceGetCount()
                if count > 0:
                    if declared:
                        log.warning("NVML found %d GPUs; ignoring --gpus", count)
                    return NvmlGpus(nvml, count)
            except nvml.NVMLError as exc:
                log.warning("NVML initialised but cannot list GPUs: %s", exc)
            nvml.nvmlShutdown()
    if declared:
        return DeclaredGpus(node_id=node_id, memory_bytes=declared)
    return NoGpus()


def cpu_count() -> int:
    """CPUs this process may run on (honours cpusets), at least 1."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def memory_total_bytes() -> int:
    """Physical memory of the machine, 0 when the OS will not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def memory_available_bytes() -> int:
    """The kernel's estimate of memory available without swapping (`MemAvailable` in
    /proc/meminfo): what a sleeping engine's weights can still take. 0 when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return 0
    return 0


class Hardware:
    """The node's hardware report and GPU usage, read without blocking the loop."""

    def __init__(self, *, gpus: GpuSource, weights_dir: Path) -> None:
        self._gpus = gpus
        self._weights_dir = weights_dir
        self._cpus = cpu_count()
        self._memory = memory_total_bytes()

    @property
    def gpu_source(self) -> str:
        return self._gpus.source

    def _report(self) -> HardwareReport:
        try:
            disk_free = shutil.disk_usage(self._weights_dir).free
        except OSError as exc:
            log.warning("cannot read free space of %s: %s", self._weights_dir, exc)
            disk_free = 0
        return HardwareReport(
            gpus=self._gpus.inventory(),
            cpu_count=self._cpus,
            memory_total_bytes=self._memory,
            weights_disk_free_bytes=disk_free,
            gpu_source=self._gpus.source,
        )

    async def report(self) -> HardwareReport:
        """A fresh report (GPU memory, free disk) for Register."""
        return await asyncio.to_thread(self._report)

    def _host(self) -> HostUsage:
        try:
            disk = shutil.disk_usage(self._weights_dir)
            disk_total, disk_free = disk.total, disk.free
        except OSError as exc:
            log.warning("cannot read the size of %s: %s", self._weights_dir, exc)
            disk_total = disk_free = 0
        return HostUsage(
            disk_total_bytes=disk_total,
            disk_free_bytes=disk_free,
            memory_total_bytes=self._memory,
            memory_available_bytes=memory_available_bytes(),
        )

    async def host(self) -> HostUsage:
        """The weights disk's size and free space and the host's available memory."""
        return await asyncio.to_thread(self._host)

    async def usage(self) -> tuple[GpuUsage, ...]:
        """Per-GPU utilisation and memory for a heartbeat; empty without NVML."""
        return await asyncio.to_thread(self._gpus.usage)
