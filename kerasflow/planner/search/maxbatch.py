"""The largest batch that fits the devices' memory under a strategy (Wavelet's comparison).

Costs and sizes in the IR are affine in the batch, so any batch can be priced: ``max_batch``
doubles the batch until a strategy's simulated peak no longer fits, then bisects.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from ..errors import InsufficientMemoryError, InvalidPlanError
from ..ir.cluster import Cluster
from ..ir.graph import OpGraph
from ..ir.graphtables import temporary_bytes
from ..ir.plan import Plan
from ..schedule.listschedule import DEFAULT_MEMORY_HEADROOM, memory_budgets
from ..parallel import baselines
from ..parallel.ticktock import pipeline, tick_tock_data_parallel, tick_tock_model_parallel
from .planning import plan
from .request import PlanRequest

__all__ = ["max_batch", "MaxBatch", "STRATEGIES"]


class MaxBatch(NamedTuple):
    """The largest batch a strategy fits in memory, and its throughput there.

    Attributes:
        strategy: the strategy's name.
        batch: the largest batch that fits.
        step_time: predicted seconds per step at that batch.
        samples_per_second: ``batch / step_time``.
        peak_memory: device -> predicted peak bytes at that batch.
        plan: the plan at that batch.
    """

    strategy: str
    batch: int
    step_time: float
    samples_per_second: float
    peak_memory: dict
    plan: Plan


def _fastt(tick_tock: str, split: bool):
    def make(graph, cluster, batch, memory_limit, memory_headroom):
        return plan(PlanRequest(graph, cluster, batch_size=batch, split=split, tick_tock=tick_tock,
                                memory_limit=memory_limit, memory_headroom=memory_headroom))
    return make


STRATEGIES: dict[str, Callable] = {
    "data_parallel": lambda g, c, b, *_: baselines.data_parallel(g, c, batch=b),
    "layerwise_model_parallel": lambda g, c, b, *_: baselines.layerwise_model_parallel(g, c, batch=b),
    "gpipe-2": lambda g, c, b, *_: pipeline(g, c, 2, batch=b),
    "gpipe-4": lambda g, c, b, *_: pipeline(g, c, 4, batch=b),
    "tick_tock_data_parallel": lambda g, c, b, *_: tick_tock_data_parallel(g, c, batch=b),
    "tick_tock_model_parallel": lambda g, c, b, *_: tick_tock_model_parallel(g, c, batch=b),
    "fastt": _fastt("off", split=False),
    "fastt+waves": _fastt("on", split=False),
}


def max_batch(graph: OpGraph, cluster: Cluster | str, strategy: str | Callable, *,
              memory_limit: float | None = None, memory_headroom: float = DEFAULT_MEMORY_HEADROOM,
              largest: int = 1 << 20) -> MaxBatch:
    """The largest batch that fits every device's memory budget under ``strategy``.

    Costs and sizes in the IR are affine in the batch, so any batch can be priced; the
    search doubles the batch until it no longer fits, then bisects.

    Args:
        graph: the step.
        cluster: a ``Cluster`` or preset name.
        strategy: a name from ``STRATEGIES`` or ``f(graph, cluster, batch, memory_limit,
            memory_headroom) -> Plan``. ``"fastt"`` and ``"fastt+waves"`` run
            ``kerasflow.plan`` (without op splitting, for speed) at every batch tried.
        memory_limit: a cap in bytes for every device.
        memory_headroom: the fraction of memory left free.
        largest: stop growing the batch here.

    Raises:
        InsufficientMemoryError: not even a batch of 1 fits.
        InvalidPlanError: an unknown strategy name.

    Example:
        >>> from kerasflow.planner import synthetic
        >>> found = max_batch(synthetic.chain_mlp(layers=2), "2xK80-pcie", "data_parallel",
        ...                   memory_limit=2**28)
        >>> found.batch > 1 and max(found.peak_memory.values()) <= 2**28 * 0.9
        True
    """
    cluster = Cluster.resolve(cluster)
    if isinstance(strategy, str):
        if strategy not in STRATEGIES:
            raise InvalidPlanError(f"Unknown strategy {strategy!r}; choose from {sorted(STRATEGIES)}.")
        name, make = strategy, STRATEGIES[strategy]
    else:
        name, make = getattr(strategy, "__name__", "custom"), strategy
    budgets = memory_budgets(cluster, memory_limit, memory_headroom, temporary_bytes(graph))

    def attempt(batch: int) -> Plan | None:
        try:
            candidate = make(graph, cluster, batch, memory_limit, memory_headroom)
        except InsufficientMemoryError:
            return None
        peaks = candidate.predicted_peak_memory
        if all(peaks.get(d, 0.0) <= b * (1 + 1e-9) for d, b in zip(cluster.device_names, budgets)):
            return candidate
        return None

    best = attempt(1)
    if best is None:
        raise InsufficientMemoryError(
            f"Strategy {name!r} does not fit even a batch of 1 on cluster {cluster.name!r}; use more or larger "
            "devices, or another strategy.")
    low, high = 1, 2
    while high <= largest:
        found = attempt(high)
        if found is None:
            break
        best, low, high = found, high, high * 2
    high = min(high, largest + 1)
    while high - low > 1:
        middle = (low + high) // 2
        found = attempt(middle)
        if found is None:
            high = middle
        else:
            best, low = found, middle
    return MaxBatch(name, low, best.predicted_step_time, low / best.predicted_step_time,
                    dict(best.predicted_peak_memory), best)
