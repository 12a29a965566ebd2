"""Bounds on the step time: one for any schedule, one per family of plans kerasflow builds.

``lower_bound`` holds for any schedule of the graph's work; it lets every batch op
share its per-sample work among all devices and sends nothing, so on large clusters it mostly
measures itself. ``step_time_bound`` bounds the plans kerasflow can express, family by family,
each by what every plan of that family must pay:

- **replicated** (data parallelism, plain, on one host, or as Tick-Tock waves): the family
  is a handful of fixed plans, so its figure is exact: the fastest of them, simulated. Every
  replica pays every op's fixed cost again and the all-reduce is in the simulation.
- **one pass** (one replica running the batch once: placements, HEFT/CPOP, critical-path
  splits): the larger of the average work (each op at its best device, over the device count)
  and the longest path, where an op counts whole unless its layer is splittable
  (``splitting.splittable_layers``; ops without a layer, and a BatchNormalization whose shards
  cannot compute its statistics together, run whole), a
  split op counts its fixed cost plus its per-sample work shared by every device, and before
  an op that runs once (the update) reads a split op's batch-independent output (a weight
  gradient), a remote shard's part must cross the fastest link: at best the consumer's device
  runs the larger share while the others' transfer lands (``_OpCosts.until_gathered``).
- **micro-batched** (one replica, the batch in two or more waves or micro-batches: Tick-Tock
  waves, pipelines): every batch op runs once per micro-batch and pays its fixed cost each
  time, while one micro-batch's path carries at most half the per-sample work.

The bound is the smallest family figure: no plan of these families simulates faster. It does
not price transfers between unsplit layers or memory, so it stays a bound, not an estimate.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from ..ir.cluster import Cluster
from ..ir.graph import OpGraph
from ..ir.graphtables import batch_ops, split_groups
from ..parallel import baselines
from ..parallel.splitting import splittable_layers
from ..parallel.ticktock import batch_coupled_ops, tick_tock_data_parallel
from .candidates import strongest_host

__all__ = ["LowerBound", "lower_bound", "StepTimeBound", "step_time_bound"]


class LowerBound(NamedTuple):
    """A lower bound on the step time and its two parts.

    Attributes:
        seconds: the bound, ``max(critical_path, average_work)``.
        critical_path: the longest chain of ops, each at its best device, with the
            per-sample part of batch ops shared by all devices (splitting can do no better).
        average_work: the total work, each op at its best device, over the device count.
    """

    seconds: float
    critical_path: float
    average_work: float


def lower_bound(graph: OpGraph, cluster: Cluster, batch: float | None = None) -> LowerBound:
    """A step time no plan (placement, splits, waves or data parallelism) can beat.

    Transfers are ignored and every op takes its fastest device, so the bound is loose
    when communication matters; it is exact for one device running a chain.

    Example:
        >>> from kerasflow.planner import synthetic
        >>> graph = synthetic.chain_mlp(layers=2)
        >>> cluster = Cluster.preset("cpu-testbed:1")
        >>> abs(lower_bound(graph, cluster).seconds - graph.total_work("CPU")) < 1e-12
        True
    """
    batch = graph.batch_size if batch is None else batch
    devices = cluster.devices
    count = len(devices)
    is_batch = batch_ops(graph)
    work = []
    chain = []
    for i, op in enumerate(graph.ops):
        best_total = best_fixed = best_per = math.inf
        for d in devices:
            cost = op.cost.get(d.kind)
            if cost is None:
                continue
            best_total = min(best_total, cost.at(batch) / d.speed)
            best_fixed = min(best_fixed, cost.fixed / d.speed)
            best_per = min(best_per, cost.per_sample * batch / d.speed)
        if best_total == math.inf:
            op.duration(devices[0].kind, batch)  # raises the clear missing-cost error
        work.append(best_total)
        chain.append(best_fixed + best_per / count if is_batch[i] and count > 1 else best_total)
    s = graph._structure
    finish = [0.0] * len(work)
    for i in s.topo:
        finish[i] = max((finish[p] for p in s.preds[i]), default=0.0) + chain[i]
    critical = max(finish, default=0.0)
    average = math.fsum(work) / count
    return LowerBound(max(critical, average), critical, average)


class StepTimeBound(NamedTuple):
    """Seconds per step no plan of a family beats, per family (``math.inf``: no such plan).

    Attributes:
        seconds: the smallest of the families counted: no plan of those beats it.
        replicated: the fastest data-parallel plan (exact: it is simulated).
        one_pass: a bound on one-replica plans that run the batch once.
        micro_batched: a bound on one-replica plans with two or more micro-batches.
    """

    seconds: float
    replicated: float
    one_pass: float
    micro_batched: float

    @property
    def one_replica(self) -> float:
        """A bound on every plan that runs one replica (``plan(replicated=False)``'s space)."""
        return min(self.one_pass, self.micro_batched)


def step_time_bound(graph: OpGraph, cluster: Cluster, batch: float | None = None, *, replicated: bool = True,
                    waves: bool | None = None) -> StepTimeBound:
    """The family bounds of ``graph`` on ``cluster`` at ``batch`` (default: the graph's batch).

    Args:
        graph: the step.
        cluster: the devices.
        batch: the batch size (default: the graph's).
        replicated: whether ``seconds`` counts the replicated family (``plan(replicated=False)``
            does not build it).
        waves: whether ``seconds`` counts the micro-batched family; None: as
            ``plan(tick_tock="auto")`` does, only when no op couples the samples of a batch
            (BatchNormalization).

    Returns:
        A ``StepTimeBound``: every family's figure, and in ``seconds`` the smallest of those
        counted.

    Example:
        >>> from kerasflow.planner import synthetic
        >>> graph, cluster = synthetic.chain_mlp(layers=2), Cluster.preset("4xV100-nvlink")
        >>> bound = step_time_bound(graph, cluster)
        >>> bound.seconds == min(bound.replicated, bound.one_pass, bound.micro_batched)  # no BatchNormalization
        True
        >>> bound.one_pass >= lower_bound(graph, cluster).seconds
        True
    """
    batch = graph.batch_size if batch is None else batch
    costs = _OpCosts(graph, cluster, batch)
    fastest_replicated = _fastest_replicated(graph, cluster, batch) if len(cluster) > 1 else math.inf
    one_pass = max(costs.work(runs=1) / costs.count, _longest_path(graph, costs, micro_batches=1))
    micro_batched = _micro_batched(graph, costs, max(2, int(batch)))
    if len(cluster) < 2:  # one device: replicating is running the step once
        fastest_replicated = one_pass
    waves = not batch_coupled_ops(graph) if waves is None else waves
    counted = [one_pass] + [fastest_replicated] * replicated + [micro_batched] * waves
    return StepTimeBound(min(counted), fastest_replicated, one_pass, micro_batched)


class _OpCosts:
    """Per op, its best fixed and per-sample seconds over the cluster's devices."""

    def __init__(self, graph: OpGraph, cluster: Cluster, batch: float):
        self.count = len(cluster)
        self.is_batch = batch_ops(graph)
        splittable = splittable_layers(graph) if self.count > 1 else set()
        self.splits = [self.is_batch[i] and layer in splittable for i, layer in enumerate(split_groups(graph))]
        self.fixed, self.per_batch = [], []
        for op in graph.ops:
            options = [(cost.fixed / d.speed, cost.per_sample * batch / d.speed)
                       for d in cluster.devices if (cost := op.cost.get(d.kind)) is not None]
            if not options:
                op.duration(cluster.devices[0].kind, batch)  # raises the clear missing-cost error
            self.fixed.append(min(fixed for fixed, _ in options))
            self.per_batch.append(min(per for _, per in options))
        names = cluster.device_names
        links = [cluster.link(a, b) for a in names for b in names if a != b] or [cluster.default_link]
        self.fastest_bandwidth = max(link.bandwidth for link in links)
        self.lowest_latency = min(link.latency for link in links)

    def work(self, runs: int) -> float:
        """All ops' seconds when every batch op runs ``runs`` times (its fixed cost each time)."""
        return math.fsum(f * (runs if b else 1) + p for f, p, b in zip(self.fixed, self.per_batch, self.is_batch))

    def on_path(self, i: int, micro_batches: float) -> float:
        """The least op ``i`` adds to a path: one micro-batch of it, split if its layer can be."""
        if not self.is_batch[i]:
            return self.fixed[i] + self.per_batch[i]
        return self.fixed[i] + self.per_batch[i] / micro_batches / (self.count if self.splits[i] else 1)

    def until_gathered(self, i: int, micro_batches: float, nbytes: float) -> float:
        """The least time from batch op ``i``'s first start until an op on one device has every
        copy's ``nbytes`` output: one device runs every copy (a fixed cost each), or the work
        is spread and a remote part's output crosses a link. Spread best, the consumer's device
        runs a share ``x`` and the others the rest in parallel: ``x = P/D + t(D-1)/D`` for a
        transfer of ``t`` seconds equalises the two sides (shares of any size allowed)."""
        alone = self.fixed[i] * micro_batches + self.per_batch[i]
        if not (self.splits[i] or micro_batches > 1) or self.count < 2:
            return alone  # it runs whole on one device
        transfer = self.lowest_latency + nbytes / self.fastest_bandwidth
        spread = self.fixed[i] + (self.per_batch[i] + transfer * (self.count - 1)) / self.count
        return min(alone, spread)


def _longest_path(graph: OpGraph, costs: _OpCosts, micro_batches: float) -> float:
    """The longest path where each op adds the least any plan of the family makes it add.

    A batch op counts one micro-batch of it, split if its layer can be. An op that runs once
    (the weight update) waits for every copy of a batch op whose output does not grow with the
    batch (a weight gradient): ``until_gathered`` after the op's first start.
    """
    s = graph._structure
    start = [0.0] * len(graph.ops)
    finish = [0.0] * len(graph.ops)
    for i in s.topo:
        own = costs.on_path(i, micro_batches)
        finish[i] = start[i] + own
        for k, consumers in s.outputs[i]:
            towards_once = 0.0
            size = graph.ops[i].output_bytes[k] if k >= 0 else None
            if costs.is_batch[i] and size is not None and not size.scales_with_batch and size.fixed > 0:
                towards_once = max(0.0, costs.until_gathered(i, micro_batches, size.fixed) - own)
            for c in consumers:
                start[c] = max(start[c], finish[i] + (0.0 if costs.is_batch[c] else towards_once))
    return max(finish, default=0.0)


def _micro_batched(graph: OpGraph, costs: _OpCosts, most: int) -> float:
    """The least any count of micro-batches from 2 to ``most`` (one sample each) can reach.

    The work grows with the count (each batch op pays a fixed cost per micro-batch), so the
    scan stops at the first count whose work alone reaches the best figure found.
    """
    best = math.inf
    for count in range(2, most + 1):
        work = costs.work(runs=count) / costs.count
        if work >= best:
            break
        best = min(best, max(work, _longest_path(graph, costs, micro_batches=count)))
    return best


def _fastest_replicated(graph: OpGraph, cluster: Cluster, batch: float) -> float:
    """The fastest data-parallel plan the planner builds (all devices, one host, Tick-Tock)."""
    batch = int(batch)
    plain = baselines.data_parallel(graph, cluster, batch=batch)
    plans = [plain, tick_tock_data_parallel(graph, cluster, batch=batch, base=plain)]
    hosts = cluster.hosts()
    if len(hosts) > 1:
        plans.append(baselines.data_parallel(graph, cluster, devices=strongest_host(cluster), batch=batch))
    return min(p.predicted_step_time for p in plans)
