"""FastT's op splitting: split the batch of critical-path layers across devices while it pays.

Each round takes the simulated schedule of the best plan so far, walks its critical path
back from the last task to finish, and tries the splittable layers on it: all of them at
once, those whose split pays on a first-order estimate (``split_pays``), then the most
expensive ones alone; for k = 2..D shards (sizes proportional to device speed; the layer's
own device plus the k-1 least busy ones), the whole graph is rescheduled and simulated
with the split. The best split found in a round is kept if it lowers the predicted step
time; the search stops when a round finds nothing better or the evaluation budget is spent.

Everything a split costs is in the simulation: the split and concat copies, the shards'
transfers, the weights sent to every shard and the gradient sums sent back; the affine
cost model charges every shard its fixed (per-kernel) cost, so tiny shards do not pay.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

from ..errors import InsufficientMemoryError
from ..ir.cluster import Cluster
from ..ir.graph import OpGraph
from ..ir.graphtables import batch_ops, group_ops, shardable_ops, split_groups, variable_groups
from ..ir.plan import Plan, Shard
from ..sim.planchecks import ran_on
from ..sim.simulator import SimulationResult, run_task_graph
from ..sim.taskgraph import TaskGraph, build_task_graph
from ..schedule.ranks import predecessors

__all__ = ["splittable_layers", "layer_weight_bytes", "split_pays", "critical_tasks", "split_search",
           "balanced_shards"]

# Makes the simulated plan of a set of splits; None once its simulation passes the seconds given.
Scheduler = Callable[[Mapping[str, Sequence[Shard]], float | None], Plan | None]


def splittable_layers(graph: OpGraph) -> set[str]:
    """Layers (and the compiled loss' pseudo-layer, ``graphtables.LOSS_GROUP``) whose batch ops can
    all be split along the batch (and that have some; ``graphtables.shardable_ops``: a
    BatchNormalization the profile lists as synchronized is split with the whole batch's
    statistics). A batch op in a colocation group of host work (string ops kept on the host
    together) rules its layer out: its shards would have to run on one device. One in a
    variable's group (a loop that reads its weights inside) does not: each shard gets the
    weights read for it."""
    is_batch, shardable = batch_ops(graph), shardable_ops(graph)
    anchored = variable_groups(graph)
    ok: dict[str, bool] = {}
    for i, (op, layer) in enumerate(zip(graph.ops, split_groups(graph))):
        if layer is None or not is_batch[i]:
            continue
        ok[layer] = ok.get(layer, True) and shardable[i] and (op.colocation is None or op.colocation in anchored)
    return {layer for layer, fine in ok.items() if fine}


def layer_weight_bytes(graph: OpGraph, batch: float) -> dict[str, float]:
    """Per layer, the bytes its forward pass reads that do not scale with the batch (its
    weights): what every extra shard must receive, and send back as a gradient."""
    is_batch = batch_ops(graph)
    weights: dict[str, float] = {}
    for i, (op, layer) in enumerate(zip(graph.ops, split_groups(graph))):
        if layer is not None and op.phase == "forward" and not is_batch[i]:
            weights[layer] = weights.get(layer, 0.0) + sum(size.at(batch) for size in op.output_bytes)
    return weights


def split_pays(path_seconds: float, weight_bytes: float, shards: int, seconds_per_byte: float) -> bool:
    """First-order test: splitting a layer ``shards`` ways saves ``1 - 1/shards`` of its time on
    the critical path and costs, per extra shard, its weights sent out and their gradient back.

    Example:
        >>> split_pays(0.010, 1e6, 4, 1e-10)   # 7.5 ms saved, 0.6 ms of copies
        True
        >>> split_pays(0.001, 4e8, 4, 1e-10)   # a dense layer's 400 MB of weights
        False
    """
    saved = path_seconds * (1 - 1 / shards)
    return saved > 2 * (shards - 1) * weight_bytes * seconds_per_byte


def critical_tasks(tg: TaskGraph, result: SimulationResult, cluster: Cluster) -> list[int]:
    """The chain of tasks that set the makespan, last first.

    From the task that ends last, step to whichever released it latest: an input (its
    end, plus the transfer when it came from another device) or the task before it on
    its device. "Before it" is the order the simulator dispatched tasks in: zero-length
    tasks that start together (the step's closing ``Identity`` and ``NoOp``) ran in data
    order, which sorting by start time and task id can reverse.
    """
    n = len(tg)
    if n == 0:
        return []
    start, end = result.task_start, result.task_end
    preds = predecessors(tg)
    previous = [-1] * n
    position = {t: i for i, t in enumerate(result.dispatch_order)}
    for device in range(len(tg.devices) + 1):
        tasks = sorted((t for t in range(n) if tg.resource[t] == device),
                       key=lambda t: (start[t], position.get(t, n), t))
        for a, b in zip(tasks, tasks[1:]):
            previous[b] = a
    cluster = ran_on(tg, cluster)  # with its host, where the tasks run some ops there
    latency, inverse = cluster.latency_matrix, cluster.inverse_bandwidth_matrix
    num_devices = len(tg.devices)
    t = max(range(n), key=lambda x: (end[x], -x))
    path = [t]
    seen = {t}
    while True:
        best, best_release = -1, -math.inf
        for p, nbytes in preds[t]:
            release = end[p]
            a, b = tg.resource[p], tg.resource[t]
            if a != b and 0 <= a < num_devices and 0 <= b < num_devices:
                release += latency[a][b] + nbytes * inverse[a][b]
            if release > best_release:
                best, best_release = p, release
        q = previous[t]
        if q >= 0 and end[q] > best_release:
            best, best_release = q, end[q]
        if best < 0 or best in seen or best_release <= 0.0:
            return path
        path.append(best)
        seen.add(best)
        t = best


def hybrid_splits(graph: OpGraph, cluster: Cluster, base: Plan) -> dict[str, tuple[Shard, ...]]:
    """A data-parallel-like start for the split search: every splittable layer whose split
    over all devices pays on the first-order estimate (``split_pays``, with the layer's whole
    time in ``base``), all with one shard map; layers heavy in weights stay whole.

    Example:
        >>> from kerasflow.planner import heft, synthetic
        >>> graph, cluster = synthetic.inception_like(blocks=1), Cluster.preset("4xV100-nvlink")
        >>> splits = hybrid_splits(graph, cluster, heft(graph, cluster))
        >>> len({shards for shards in splits.values()}) <= 1
        True
    """
    candidates = splittable_layers(graph)
    if len(cluster) < 2 or not candidates:
        return {}
    batch = base.batch_size or graph.batch_size
    tg = build_task_graph(graph, cluster, base, batch)
    layer_seconds: dict[str, float] = {}
    groups = split_groups(graph)
    for t in range(len(tg)):
        if tg.role[t] == "op" and tg.shard[t] < 0:
            layer = groups[tg.base[t]]
            if layer in candidates:
                layer_seconds[layer] = layer_seconds.get(layer, 0.0) + tg.duration[t]
    weights = layer_weight_bytes(graph, batch)
    slowest_seconds_per_byte = max(max(row) for row in cluster.inverse_bandwidth_matrix)
    shards = balanced_shards(cluster, cluster.device_names)
    return {layer: shards for layer in sorted(layer_seconds)
            if split_pays(layer_seconds[layer], weights.get(layer, 0.0), len(cluster), slowest_seconds_per_byte)}


def _distinct(moves: list[list[str]]) -> list[list[str]]:
    """The non-empty moves, each once, in their first order."""
    seen: set[tuple[str, ...]] = set()
    kept = []
    for move in moves:
        if move and tuple(move) not in seen:
            seen.add(tuple(move))
            kept.append(move)
    return kept


def balanced_shards(cluster: Cluster, devices: Sequence[str]) -> tuple[Shard, ...]:
    """Shards over ``devices`` with batch fractions proportional to their speed.

    Example:
        >>> from kerasflow.planner import Cluster
        >>> balanced_shards(Cluster.preset("4xV100-pcie"), ["/GPU:0", "/GPU:1"])
        (Shard(device='/GPU:0', fraction=0.5), Shard(device='/GPU:1', fraction=0.5))
    """
    speeds = [cluster.device(d).speed for d in devices]
    total = math.fsum(speeds)
    fractions = [s / total for s in speeds]
    fractions[-1] = 1.0 - math.fsum(fractions[:-1])
    return tuple(Shard(d, f) for d, f in zip(devices, fractions))


def split_search(graph: OpGraph, cluster: Cluster, base: Plan, schedule: Scheduler, *,
                 max_evaluations: int = 48, layers_per_round: int = 2,
                 progress: Callable[[int], None] | None = None) -> tuple[Plan, int]:
    """Greedy critical-path splitting starting from ``base`` (see the module docstring).

    Args:
        graph: the step.
        cluster: the devices.
        base: the best plan without (further) splits, simulated.
        schedule: makes a simulated plan for a given set of splits (HEFT or CPOP), or None once
            its simulation passes the seconds given (the round's best: it could not be kept).
        max_evaluations: the most plans to schedule and simulate.
        layers_per_round: how many critical-path layers to try per round.
        progress: called with the number of evaluations after each one.

    Returns:
        ``(best plan, evaluations used)``; the best plan is ``base`` when no split pays.
    """
    candidates = splittable_layers(graph)
    layer_ops, groups = group_ops(graph), split_groups(graph)
    best = base
    evaluations = 0
    if len(cluster) < 2 or not candidates:
        return best, evaluations
    batch = base.batch_size or graph.batch_size
    names = cluster.device_names
    weights = layer_weight_bytes(graph, batch)
    slowest_seconds_per_byte = max(max(row) for row in cluster.inverse_bandwidth_matrix)
    while evaluations < max_evaluations:
        tg = build_task_graph(graph, cluster, best, batch)
        result = run_task_graph(tg, cluster, memory=False)
        on_path: dict[str, float] = {}
        for t in critical_tasks(tg, result, cluster):
            if tg.role[t] != "op" or tg.shard[t] >= 0:
                continue
            layer = groups[tg.base[t]]
            if layer in candidates and layer not in best.splits:
                on_path[layer] = on_path.get(layer, 0.0) + tg.duration[t]
        if not on_path:
            break
        busy = result.busy

        def shards(layer: str, k: int) -> tuple[Shard, ...]:
            home = best.placement[graph.ops[layer_ops[layer][0]].name]
            others = sorted((d for d in names if d != home), key=lambda d: (busy[d], names.index(d)))
            return balanced_shards(cluster, [home] + others[:k - 1])

        # Moves of this round: every critical-path layer at once (a step towards data
        # parallelism where that pays), the subset whose split pays on a first-order
        # estimate (a hybrid: convolutions split, weight-heavy dense layers left whole, as in
        # Krizhevsky's "one weird trick"), then one by one the most expensive layers and
        # every paying one (the only paying layer may be far down the path: RNNLM's softmax).
        ranked = sorted(on_path, key=lambda l: (-on_path[l], l))
        paying = [layer for layer in ranked
                  if split_pays(on_path[layer], weights.get(layer, 0.0), len(names), slowest_seconds_per_byte)]
        moves = _distinct([ranked, paying] + [[layer] for layer in ranked[:layers_per_round] + paying])
        round_best = best
        for layers in moves:
            for k in range(2, len(names) + 1):
                if evaluations >= max_evaluations:
                    break
                splits = dict(best.splits)
                splits.update({layer: shards(layer, k) for layer in layers})
                evaluations += 1
                to_beat = round_best.predicted_step_time * (1 - 1e-9)
                try:
                    plan = schedule(splits, to_beat)
                except InsufficientMemoryError:
                    continue
                finally:
                    if progress is not None:
                        progress(evaluations)
                if plan is not None and plan.predicted_step_time < to_beat:
                    round_best = plan
        if round_best is best:
            break
        best = round_best
    return best, evaluations
