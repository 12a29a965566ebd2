"""Checks a plan against its graph and cluster, before and after it is expanded into tasks.

``resolve_plan`` runs before the task graph is built: every op placed on a device of the
cluster, colocation groups whole, split layers present and splittable, stage maps on known
devices; it returns the plan's devices as indices. ``attach_orders`` runs after: each device's
order lists exactly that device's op tasks, and no order runs a task before one it depends on.
Each failure is one ``InvalidPlanError`` naming the op, the device or the order and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidPlanError
from ..ir.cluster import Cluster
from ..ir.graph import OpGraph
from ..ir.graphtables import (batch_ops, colocation_groups, gradient_sums, group_ops, host_held_ops, layer_readers,
                              shardable_ops, split_groups)
from ..ir.plan import Plan
from ..ir.toposort import topological_order

__all__ = ["ResolvedPlan", "resolve_plan", "attach_orders", "ran_on"]


@dataclass
class ResolvedPlan:
    """A checked plan with device indices (positions in the cluster's device list).

    Attributes:
        is_batch: per op, whether it is a batch op (``graphtables.batch_ops``).
        place: per op, its device (without data parallelism), else None.
        replica_devices: the data-parallel replicas' devices, else empty.
        shards_of_layer: split layer -> ((device, fraction), ...).
        whole: ops of split layers that run once all the same: a layer's sum of gradients that
            no shard with the layer's shards feeds (``graphtables.gradient_sums``).
        wave_count, wave_fraction: the waves, and each one's share of the batch.
        stage_maps: per wave, device -> device, or None for identity.
    """

    is_batch: list[bool]
    place: list[int] | None
    replica_devices: list[int]
    shards_of_layer: dict[str, tuple[tuple[int, float], ...]]
    whole: frozenset[int]
    wave_count: int
    wave_fraction: list[float]
    stage_maps: list[dict[int, int] | None]


def device_index(cluster: Cluster, name: str, what: str) -> int:
    """The position of device ``name`` in ``cluster``, or the error naming ``what`` refers to it."""
    index = _positions(cluster).get(name)
    if index is None:
        raise InvalidPlanError(
            f"{what} names device {name!r}, which is not in cluster {cluster.name!r} "
            f"(devices: {cluster.device_names}). Replan for this cluster or fix the device.")
    return index


def _positions(cluster: Cluster) -> dict[str, int]:
    return {name: i for i, name in enumerate(cluster.device_names)}


def ran_on(tg, cluster: Cluster) -> Cluster:
    """The cluster whose devices ``tg``'s are: ``cluster``, or with its host (``Cluster.hosted``)
    where the tasks were built with it (``taskgraph.build_task_graph``)."""
    return cluster.hosted if len(tg.devices) > len(cluster) else cluster


def resolve_plan(graph: OpGraph, cluster: Cluster, plan: Plan) -> ResolvedPlan:
    """Checks ``plan``'s placement, splits and waves against ``graph`` and ``cluster``.

    Raises:
        InvalidPlanError: an op without a device or on an unknown one, an op the graph does not
            have, a split colocation group, a split of an unknown or unsplittable layer.
    """
    is_batch = batch_ops(graph)
    place = None
    replica_devices: list[int] = []
    if plan.data_parallel is None:
        place = _placement(graph, cluster, plan, is_batch)
    else:
        replica_devices = [device_index(cluster, d, "data_parallel") for d in plan.data_parallel.devices]
    shards_of_layer = _splits(graph, cluster, plan, is_batch)
    waves = plan.waves
    wave_count = waves.count if waves is not None else 1
    wave_fraction = [waves.fraction(w) if waves else 1.0 for w in range(wave_count)]
    stage_maps: list[dict[int, int] | None] = []
    for w in range(wave_count):
        if waves is None or not waves.stage_maps or not waves.stage_maps[w]:
            stage_maps.append(None)
            continue
        what = f"waves.stage_maps[{w}]"
        stage_maps.append({device_index(cluster, a, what): device_index(cluster, b, what)
                           for a, b in waves.stage_maps[w].items()})
    return ResolvedPlan(is_batch, place, replica_devices, shards_of_layer, _whole_sums(graph, shards_of_layer),
                        wave_count, wave_fraction, stage_maps)


def _whole_sums(graph: OpGraph, shards_of_layer: dict) -> frozenset[int]:
    """The split layers' sums of gradients that run whole: the runtime sums the gradients of a
    split layer's output shard by shard only where a layer reading the output took its shards
    directly (one split with the same shards); otherwise it sums the whole gradient of the
    joined output, then cuts it."""
    if not shards_of_layer:
        return frozenset()
    groups, readers = split_groups(graph), layer_readers(graph)
    return frozenset(i for i in gradient_sums(graph) if groups[i] in shards_of_layer and not any(
        shards_of_layer.get(reader) == shards_of_layer[groups[i]] for reader in readers.get(groups[i], ())))


def _placement(graph: OpGraph, cluster: Cluster, plan: Plan, is_batch: list[bool]) -> list[int]:
    ops, placement, groups = graph.ops, plan.placement, split_groups(graph)
    positions = _positions(cluster.hosted)  # a host (last) runs the host-only ops (``hostops``)
    try:
        place = [positions[placement[op.name]] for op in ops]
    except KeyError:
        place = [_placed(cluster, plan, op.name) for op in ops]
    held = host_held_ops(graph)
    if cluster.host is not None and place.count(len(cluster)) > len(held):
        stray = next(op.name for i, op in enumerate(ops) if place[i] == len(cluster) and i not in held)
        raise InvalidPlanError(
            f"op {stray!r} is placed on the host {cluster.host.name!r}, which holds only the batch and runs only "
            f"the ops no device can (string ops, lookup tables). Place it on one of the devices "
            f"{cluster.device_names}.")
    if len(placement) != len(ops):
        unknown = [name for name in placement if name not in graph]
        raise InvalidPlanError(
            f"The plan places {len(unknown)} op(s) the graph does not have, e.g. "
            f"{unknown[:3]}; it was made for another graph (fingerprint "
            f"{plan.graph_fingerprint or 'unknown'}, graph's {graph.fingerprint()}). Replan.")
    for group, members in colocation_groups(graph):
        # A loop of a split layer that reads the group's variable runs as shards, each on its
        # shard's device with the weights read for it: its own entry does not bind the group.
        members = [i for i in members if not (is_batch[i] and groups[i] in plan.splits)]
        device = place[members[0]] if members else None
        for i in members:
            if place[i] != device:
                raise InvalidPlanError(
                    f"colocation group {group!r} is split: op {ops[members[0]].name!r} is on "
                    f"{placement[ops[members[0]].name]!r} but op {ops[i].name!r} is on "
                    f"{placement[ops[i].name]!r}. A variable, its reads and its updates must "
                    "share one device.")
    return place


def _placed(cluster: Cluster, plan: Plan, name: str) -> int:
    device = plan.placement.get(name)
    if device is None:
        raise InvalidPlanError(
            f"op {name!r} has no device in the plan's placement; every op needs one. "
            "Replan for this graph.")
    return device_index(cluster.hosted, device, f"placement of op {name!r}")


def _splits(graph: OpGraph, cluster: Cluster, plan: Plan, is_batch: list[bool]) -> dict:
    layers = group_ops(graph) if plan.splits else {}
    shardable = shardable_ops(graph) if plan.splits else []
    shards_of_layer: dict[str, tuple[tuple[int, float], ...]] = {}
    for layer, shards in plan.splits.items():
        if layer not in layers:
            raise InvalidPlanError(
                f"The plan splits layer {layer!r}, which the graph does not have "
                f"(layers: {sorted(layers)[:8]}...). Replan for this graph.")
        for i in layers[layer]:
            op = graph.ops[i]
            name = op.name
            if is_batch[i] and not shardable[i]:
                raise InvalidPlanError(
                    f"layer {layer!r} cannot be split: its op {name!r}"
                    f"{f' ({op.type})' if op.type else ''} has no batch axis to split along (it couples "
                    "the samples of a batch, draws random numbers, or, in a tf-keras model, reads its weights "
                    "inside a loop). Remove the split.")
        shards_of_layer[layer] = tuple(
            (device_index(cluster, s.device, f"split of layer {layer!r}"), s.fraction) for s in shards)
    return shards_of_layer


def attach_orders(tg, cluster: Cluster, plan: Plan, *, causal: bool = False) -> None:
    """Sets ``tg.orders`` from ``plan.order``, checking each device's order lists exactly its op
    tasks once and that no order runs a task before one it depends on.

    ``causal=True`` skips the second check, for orders read from a simulation of these tasks
    (``SimulationResult.start_order``): each device's tasks in the order they started, every
    one after its inputs ended, cannot contradict the data flow.
    """
    if not plan.order:
        return
    ids = {}
    expected: list[list[int]] = [[] for _ in tg.devices]
    for t, (name, role, resource) in enumerate(zip(tg.names, tg.role, tg.resource)):
        if role == "op":
            ids[name] = t
            if 0 <= resource < len(expected):
                expected[resource].append(t)
    cluster = ran_on(tg, cluster)
    for device, names in plan.order.items():
        d = device_index(cluster, device, "order")
        seen = []
        for name in names:
            t = ids.get(name)
            if t is None:
                raise InvalidPlanError(
                    f"order[{device!r}] names task {name!r}, which is not a task of this plan "
                    "(task names are op names with @r/@w/@s suffixes for copies). Replan.")
            if tg.resource[t] != d:
                raise InvalidPlanError(
                    f"order[{device!r}] lists task {name!r}, which runs on "
                    f"{tg.devices[tg.resource[t]]!r}. List each task in its own device's order.")
            seen.append(t)
        if len(set(seen)) != len(seen) or sorted(seen) != expected[d]:
            missing = sorted(set(expected[d]) - set(seen))
            detail = (f"it misses {[tg.names[t] for t in missing[:3]]}" if missing
                      else "it lists a task twice")
            raise InvalidPlanError(
                f"order[{device!r}] must list each of the device's {len(expected[d])} tasks once; "
                f"{detail}. Replan, or drop the order to run by priority.")
        tg.orders[d] = seen
    if not causal:
        _check_orders_acyclic(tg)


def _check_orders_acyclic(tg) -> None:
    successors = [[c for _, _, consumers in entries for c in consumers] for entries in tg.outputs]
    indegree = list(tg.npreds)
    for seq in tg.orders:
        for a, b in zip(seq or (), (seq or ())[1:]):
            successors[a].append(b)
            indegree[b] += 1
    stuck = set(topological_order(successors, indegree)[1])
    if not stuck:
        return
    for d, seq in enumerate(tg.orders):
        if not seq:
            continue
        for position, t in enumerate(seq):
            if t in stuck:
                blocker = _blocking_predecessor(tg, t, set(seq[position + 1:]))
                reason = (f"it depends on {tg.names[blocker]!r}, which comes later in that order"
                          if blocker is not None else "it waits on a task that waits on this order")
                raise InvalidPlanError(
                    f"order[{tg.devices[d]!r}] runs {tg.names[t]!r} too early: {reason}. "
                    "Orders must respect the data flow; replan or fix the order.")
    raise InvalidPlanError("The plan's orders contradict the data flow; replan.")


def _blocking_predecessor(tg, task: int, later: set[int]) -> int | None:
    """A task in ``later`` that ``task`` depends on, searching backwards (BFS)."""
    preds: dict[int, list[int]] = {}
    for t, outs in enumerate(tg.outputs):
        for _, _, consumers in outs:
            for c in consumers:
                preds.setdefault(c, []).append(t)
    frontier, seen = [task], {task}
    while frontier:
        nxt = []
        for t in frontier:
            for p in preds.get(t, ()):
                if p in later:
                    return p
                if p not in seen:
                    seen.add(p)
                    nxt.append(p)
        frontier = nxt
    return None
