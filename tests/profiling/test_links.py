"""Fitting a link's latency and bandwidth from timed copies: on relative error, and refused when the
times do not grow with the bytes (dispatch or noise, not the link)."""

import numpy as np
import pytest

from kerasflow import KerasflowError
from kerasflow.profiling.links import _fit


def samples(latency, bandwidth, noise, seed=0):
    """Copies of 1 KiB to 16 MiB taking ``latency + bytes / bandwidth``, each off by up to ``noise`` of itself."""
    rng = np.random.default_rng(seed)
    sizes = [2.0**k for k in range(10, 25, 2)]
    return [(size, (latency + size / bandwidth) * (1 + rng.uniform(-noise, noise))) for size in sizes]


@pytest.mark.parametrize("latency, bandwidth", [(5e-6, 300e9), (1e-4, 1.5e9), (2e-3, 0.45e9)])
def test_latency_and_bandwidth_come_back_from_noisy_copies(latency, bandwidth):
    # 5 % noise on every copy: an unweighted fit would let the 16 MiB copy's noise swamp the
    # latency (for NVLink's 5 us, its noise alone is 3 us).
    for seed in range(5):
        link = _fit(samples(latency, bandwidth, 0.05, seed))
        assert link.latency == pytest.approx(latency, rel=0.25)
        assert link.bandwidth == pytest.approx(bandwidth, rel=0.1)


def test_times_that_do_not_grow_with_the_bytes_are_refused():
    dispatch_bound = [(2.0**k, 1e-4 - 1e-12 * 2.0**k) for k in range(10, 25, 2)]
    with pytest.raises(KerasflowError, match="do not grow with the bytes copied.*dispatch or noise"):
        _fit(dispatch_bound)


def test_a_copy_rate_comes_back_from_noisy_concatenations():
    from kerasflow.profiling.links import copy_rate

    for seed in range(5):
        assert copy_rate(samples(2e-6, 40e9, 0.05, seed), "CPU") == pytest.approx(40e9, rel=0.1)


@pytest.mark.parametrize("kind, datasheet", [("H100", 3.35e12), ("CPU", 20e9), ("a card without a datasheet", 20e9)])
def test_a_dispatch_bound_copy_rate_is_the_datasheets_said_once(kind, datasheet):
    # A GPU's 16 MiB concatenation timed in one eager call each: its dispatch, flat or falling.
    from kerasflow.planner.ir.hardware import DEVICE_SPECS
    from kerasflow.profiling.links import copy_rate

    if kind in DEVICE_SPECS:
        assert DEVICE_SPECS[kind].memory_bandwidth == pytest.approx(datasheet)
    dispatch_bound = [(2.0**k, 5e-5 - 1e-13 * 2.0**k) for k in range(21, 26)]
    with pytest.warns(RuntimeWarning, match=f"a {kind} device's copy kernels measured no rate.*datasheet's") as said:
        assert copy_rate(dispatch_bound, kind) == pytest.approx(datasheet)
    assert len(said) == 1
