"""A stand-in for the ``pynvml`` module (the few functions the backpressure NVML probe calls).

Pass an instance wherever a ``pynvml`` module is expected, e.g.
``NvmlProbe(module=FakeNvml.for_server(server))``. Readings come from callables, so a test can tie GPU
memory to a simulated inference server's KV cache, or set fixed values, or make NVML fail::

    nvml = FakeNvml(total_bytes=80 * 2**30, used_bytes=lambda: 60 * 2**30, utilization=lambda: 97)
    nvml.fail_init = True      # behaves like a host without a driver
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["FakeNvml", "NVMLError"]


class NVMLError(Exception):
    """What the fake raises (the real module raises ``pynvml.NVMLError``)."""


@dataclass(frozen=True)
class _Memory:
    total: int
    used: int
    free: int


@dataclass(frozen=True)
class _Utilization:
    gpu: int
    memory: int


class FakeNvml:
    """One or more fake GPUs with the same readings. Counts calls so tests can check the probe's use."""

    def __init__(
        self,
        *,
        total_bytes: int = 80 * 2**30,
        used_bytes: Callable[[], float] | float = 0,
        utilization: Callable[[], float] | float = 0,
        device_count: int = 1,
    ) -> None:
        self.total_bytes = total_bytes
        self._used = used_bytes
        self._utilization = utilization
        self.device_count = device_count
        self.fail_init = False
        self.fail_reads = False
        self.init_calls = 0
        self.read_calls = 0

    @classmethod
    def for_server(cls, server: Any, *, weights_fraction: float = 0.5, total_bytes: int = 80 * 2**30) -> FakeNvml:
        """GPU memory = model weights (``weights_fraction`` of the card) + the server's KV cache in use, where
        the KV cache is the rest of the card (``server``: an :class:`~.inference_server.InferenceServer`)."""

        def used() -> float:
            kv_fraction = float(server.memory_used) / float(server.spec.memory_tokens)
            return total_bytes * (weights_fraction + (1.0 - weights_fraction) * kv_fraction)

        def busy() -> float:
            return 100.0 if server.running else 0.0

        return cls(total_bytes=total_bytes, used_bytes=used, utilization=busy)

    # -- the pynvml surface ---------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.fail_init:
            raise NVMLError("NVML Shared Library Not Found (simulated)")

    def nvmlShutdown(self) -> None:
        return None

    def nvmlDeviceGetCount(self) -> int:
        return self.device_count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < self.device_count:
            raise NVMLError(f"Invalid Argument: no GPU {index} (simulated)")
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Memory:
        self._read()
        used = int(min(self.total_bytes, max(0.0, _value(self._used))))
        return _Memory(self.total_bytes, used, self.total_bytes - used)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> _Utilization:
        self._read()
        return _Utilization(int(_value(self._utilization)), 0)

    def _read(self) -> None:
        self.read_calls += 1
        if self.fail_reads:
            raise NVMLError("GPU is lost (simulated)")


def _value(source: Callable[[], float] | float) -> float:
    value: float = source() if callable(source) else source
    return float(value)
