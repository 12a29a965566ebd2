"""Published figures of the accelerators kerasflow knows, for presets and static cost estimates.

Every figure is a vendor datasheet number (peak, not achieved); the sources are cited per
entry. Static estimates apply ``efficiency`` on top, because real kernels rarely reach peak.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["DeviceSpec", "DEVICE_SPECS", "GiB", "GB"]

GiB = 1024**3
GB = 1e9


class DeviceSpec(NamedTuple):
    """Datasheet figures of one device kind.

    Args:
        kind: the name used in op costs (``"V100"``).
        peak_flops: dense FP32 operations per second (not tensor-core TF32/FP16).
        memory_bandwidth: device memory bandwidth in bytes/s.
        memory: device memory in bytes.
        launch_overhead: seconds a kernel costs even when it does no work.

    Example:
        >>> DEVICE_SPECS["V100"].memory_bandwidth
        900000000000.0
    """

    kind: str
    peak_flops: float
    memory_bandwidth: float
    memory: int
    launch_overhead: float


DEVICE_SPECS: dict[str, DeviceSpec] = {
    # Tesla K80 datasheet: per board 8.73 TFLOPS FP32 with boost, 480 GB/s, 24 GB, two GPUs;
    # the figures here are one GPU's half.
    "K80": DeviceSpec("K80", 4.37e12, 240e9, 12 * GiB, 10e-6),
    # Tesla V100 SXM2 datasheet: 15.7 TFLOPS FP32, 900 GB/s HBM2, 16 GB.
    "V100": DeviceSpec("V100", 15.7e12, 900e9, 16 * GiB, 5e-6),
    # A100 SXM4 40GB datasheet: 19.5 TFLOPS FP32, 1,555 GB/s HBM2, 40 GB.
    "A100": DeviceSpec("A100", 19.5e12, 1555e9, 40 * GiB, 4e-6),
    # H100 SXM5 datasheet: 67 TFLOPS FP32, 3.35 TB/s HBM3, 80 GB.
    "H100": DeviceSpec("H100", 67e12, 3350e9, 80 * GiB, 3e-6),
    # H200 SXM datasheet: 67 TFLOPS FP32 (H100 compute), 4.8 TB/s HBM3e, 141 GB.
    "H200": DeviceSpec("H200", 67e12, 4800e9, 141 * GB, 3e-6),
    # One logical CPU of the testbed: one core with AVX2 FMA at ~3 GHz (2 x 8-wide FMA
    # = 96 GFLOPS peak) and a share of DDR4 bandwidth (~20 GB/s); TF op dispatch ~10 us.
    "CPU": DeviceSpec("CPU", 96e9, 20e9, 4 * GiB, 10e-6),
    # A task of the independent-device testbed (kerasflow.testbed): the same core, its own kind.
    "CPU-core": DeviceSpec("CPU-core", 96e9, 20e9, 4 * GiB, 10e-6),
}
