"""The list-scheduling engine HEFT and CPOP share: insertion slots, memory limits, colocation.

Tasks are taken highest priority first among those whose inputs are scheduled. For each
device a task may use, its inputs' arrival (producer finish, plus latency + bytes /
bandwidth across devices) gives a ready time; the task takes the earliest idle gap of
that device, at or after the ready time, long enough for it (insertion-based: devices
keep their busy intervals, unlike FastT's released code, which ignores device busy time).
The device is the one where the task finishes earliest, unless the caller prefers one.

Memory is a hard limit: a device takes a task only if the bytes live there (weights and
optimizer slots of the variables it holds, outputs whose consumers are not all scheduled
yet, copies of inputs received from other devices), plus the task's outputs and temp
bytes, fit its budget. The estimate follows scheduling order; the planner checks the
final plan's simulated peaks too.

Colocation: the ops of a group (a variable, its reads, its updates) share a device. A
group's first ops (the variable and its reads) wait unplaced until an op that uses them is
placed; the group then joins that op's device, so weights sit where they are used. A split
layer's weights are used on every shard's device: they go to the shard device with the least
group work (variable reads and updates) homed on it so far, so the updates of many split
layers spread over the devices instead of queueing on the first shard's.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from .cluster import Cluster
from .errors import InsufficientMemoryError
from .graph import OpGraph
from .ranks import TaskCosts, predecessors, topological_tasks
from .taskgraph import TaskGraph

__all__ = ["Schedule", "list_schedule", "memory_budgets", "DEFAULT_MEMORY_HEADROOM"]

# Fraction of each device's memory the planner leaves free: TensorFlow's allocator
# fragments, cuDNN/cuBLAS take workspaces and the runtime keeps buffers of its own.
DEFAULT_MEMORY_HEADROOM = 0.1


def memory_budgets(cluster: Cluster, memory_limit: float | None = None,
                   headroom: float = DEFAULT_MEMORY_HEADROOM) -> list[float]:
    """Bytes the planner may use on each device.

    Args:
        cluster: the devices.
        memory_limit: a cap in bytes for every device (e.g. to plan for a smaller card).
        headroom: the fraction of memory left free (default 10 %).

    Example:
        >>> memory_budgets(Cluster.preset("2xK80-pcie"), memory_limit=1e9)
        [900000000.0, 900000000.0]
    """
    if not 0 <= headroom < 1:
        raise InsufficientMemoryError(f"memory headroom must be in [0, 1); received {headroom!r}.")
    budgets = []
    for device in cluster.devices:
        memory = device.memory if memory_limit is None else min(device.memory, memory_limit)
        budgets.append(memory * (1.0 - headroom))
    return budgets


@dataclass
class Schedule:
    """Where and when each task runs, as the list scheduler decided.

    Attributes:
        device: device index per task.
        start, finish: seconds per task.
        sequence: per device, its task ids in start order.
        makespan: the scheduler's own estimate (the simulator's figure is the one plans carry).
    """

    device: list[int]
    start: list[float]
    finish: list[float]
    sequence: list[list[int]]
    makespan: float


def _bytes(value: float) -> str:
    return f"{value / 2**20:,.1f} MiB"


def list_schedule(tg: TaskGraph, graph: OpGraph, cluster: Cluster, priority: list[float], *,
                  costs: TaskCosts | None = None, fixed: list[int] | None = None,
                  preferred: dict[int, int] | None = None, budgets: list[float] | None = None,
                  affinity: str = "op") -> Schedule:
    """Schedules every task of ``tg`` (see the module docstring).

    Args:
        tg: the expanded step (its resources are ignored; ``fixed`` pins tasks).
        graph: the graph it comes from.
        cluster: the devices and links.
        priority: larger runs first among ready tasks.
        costs: task durations per device (computed when None).
        fixed: per task a device index it must run on, or -1.
        preferred: task -> device to use when it fits (CPOP's critical-path device).
        budgets: bytes per device (default: ``memory_budgets(cluster)``).
        affinity: ``"op"`` places ops one by one (colocation groups together);
            ``"layer"`` keeps all ops of a layer (forward, backward, update) on one device,
            so a layer's saved activations never cross a link.

    Raises:
        InsufficientMemoryError: no device can hold some op.
    """
    n = len(tg)
    num_devices = len(cluster)
    costs = costs or TaskCosts(tg, graph, cluster, fixed)
    fixed = fixed or [-1] * n
    preferred = preferred or {}
    budgets = budgets or memory_budgets(cluster)
    latency = cluster.latency_matrix
    inverse = cluster.inverse_bandwidth_matrix
    class_costs = costs.by_class
    device_class = costs.device_class
    preds = predecessors(tg)
    outputs = tg.outputs
    topo_position = [0] * n
    for position, t in enumerate(topological_tasks(tg)):
        topo_position[t] = position

    groups = _scheduling_groups(tg, graph, fixed, class_costs, affinity)
    group_of, group_device, group_persistent = groups.group_of, groups.device, groups.persistent
    group_work, shard_devices = groups.work, groups.shard_devices
    homed_work = [0.0] * num_devices
    deferred_members: list[list[int]] = [[] for _ in group_device]
    deferred_cost = [[0.0] * len(class_costs) for _ in group_device]
    is_deferred = [False] * n

    device = [-1] * n
    start = [0.0] * n
    finish = [0.0] * n
    timelines = _Timelines(num_devices)
    slot = timelines.slot
    live = [0.0] * num_devices
    out_total = [sum(sizes) for sizes in tg.out_sizes]
    waiting_consumers = [sum(len(c) for _, _, c in entries) for entries in outputs]
    # producer -> [(device, bytes, arrival)] of the copies of its outputs sent to other devices
    copies: list[list[tuple[int, float, float]]] = [[] for _ in range(n)]
    # Each directed link carries one transfer at a time, as in the simulator.
    link_free = [[0.0] * num_devices for _ in range(num_devices)]

    def arrival_on(p: int, nbytes: float, d: int) -> tuple[float, bool]:
        """When p's output can be on device d, and whether that needs a new transfer."""
        dp = device[p]
        if dp == d:
            return finish[p], False
        for x, _, arrival in copies[p]:
            if x == d:
                return arrival, False
        begin = finish[p] if finish[p] > link_free[dp][d] else link_free[dp][d]
        return begin + latency[dp][d] + nbytes * inverse[dp][d], True

    def place(t: int, d: int, ready: float) -> None:
        duration = class_costs[device_class[d]][t]
        begin = timelines.occupy(d, t, ready, duration)
        device[t], start[t], finish[t] = d, begin, begin + duration

    def release(t: int) -> None:
        """A consumer of ``t`` was scheduled: free t's outputs once all consumers are."""
        waiting_consumers[t] -= 1
        if waiting_consumers[t] == 0:
            if device[t] >= 0:
                live[device[t]] -= out_total[t]
            for d, nbytes, _ in copies[t]:
                live[d] -= nbytes

    def bind(g: int, d: int) -> None:
        group_device[g] = d
        live[d] += group_persistent[g]
        homed_work[d] += group_work[g][device_class[d]]
        ready = 0.0
        for member in deferred_members[g]:
            member_ready = max((finish[p] for p, _ in preds[member] if device[p] >= 0), default=0.0)
            place(member, d, max(ready, member_ready))
            ready = finish[member]
            is_deferred[member] = False
            live[d] += out_total[member]
            for p, _ in preds[member]:
                release(p)
        deferred_members[g].clear()

    def home_by_load(g: int, devices: list[int]) -> int:
        """The device of ``devices`` with the least group work once ``g`` joins it (memory
        permitting; the first such device on a tie)."""
        roomy = [d for d in devices if live[d] + group_persistent[g] <= budgets[d]] or devices
        return min(roomy, key=lambda d: (homed_work[d] + group_work[g][device_class[d]], devices.index(d)))

    missing = list(tg.npreds)
    heap = [(-priority[t], topo_position[t], t) for t in range(n) if missing[t] == 0]
    heapq.heapify(heap)

    def done(t: int) -> None:
        for _, _, consumers in outputs[t]:
            for c in consumers:
                missing[c] -= 1
                if missing[c] == 0:
                    heapq.heappush(heap, (-priority[c], topo_position[c], c))

    while heap:
        t = heapq.heappop(heap)[2]
        g = group_of[t]
        if g >= 0 and group_device[g] < 0 and fixed[t] < 0 and all(group_of[p] == g for p, _ in preds[t]):
            # A variable or a read of it: wait for the op that uses it.
            is_deferred[t] = True
            deferred_members[g].append(t)
            for c in range(len(class_costs)):
                deferred_cost[g][c] += class_costs[c][t]
            done(t)
            continue
        pending_groups = {group_of[p] for p, _ in preds[t] if is_deferred[p]}
        if g >= 0 and group_device[g] < 0:
            pending_groups.add(g)
        if fixed[t] >= 0 and tg.shard[t] >= 0 and pending_groups:
            # A split layer's weights: homed by load among its shards' devices, then copied.
            for x in sorted(pending_groups):
                bind(x, home_by_load(x, shard_devices[tg.base[t]]))
            pending_groups = set()
        if fixed[t] >= 0:
            candidates = [fixed[t]]
        elif g >= 0 and group_device[g] >= 0:
            candidates = [group_device[g]]
        else:
            candidates = range(num_devices)
        binding_bytes = sum(group_persistent[x] for x in pending_groups)
        best = None
        largest_free = -1.0
        smallest_need = float("inf")
        for d in candidates:
            ready = 0.0
            received = 0.0
            for p, nbytes in preds[t]:
                if is_deferred[p]:
                    arrival = deferred_cost[group_of[p]][device_class[d]]
                else:
                    arrival, new = arrival_on(p, nbytes, d)
                    if new:
                        received += nbytes
                if arrival > ready:
                    ready = arrival
            need = out_total[t] + tg.temp[t] + binding_bytes + received + (
                tg.persistent[t] if g < 0 else 0.0)
            free = budgets[d] - live[d]
            if need > free:
                largest_free = max(largest_free, free)
                smallest_need = min(smallest_need, need)
                continue
            begin, _ = slot(d, ready, class_costs[device_class[d]][t])
            eft = begin + class_costs[device_class[d]][t]
            key = (0 if preferred.get(t) == d else 1, eft, d) if t in preferred else (eft, d)
            if best is None or key < best[0]:
                best = (key, d)
        if best is None:
            raise _fits_nowhere(graph.ops[tg.base[t]].name if tg.base[t] >= 0 else tg.names[t], smallest_need,
                                largest_free, budgets)
        d = best[1]
        for x in sorted(pending_groups):
            bind(x, d)
        # Commit the transfers (deferred inputs are placed for real now) and the task.
        ready = 0.0
        for p, nbytes in preds[t]:
            arrival, new = arrival_on(p, nbytes, d)
            if new:
                link_free[device[p]][d] = arrival
                copies[p].append((d, nbytes, arrival))
                live[d] += nbytes
            if arrival > ready:
                ready = arrival
        place(t, d, ready)
        live[d] += out_total[t] + (tg.persistent[t] if g < 0 else 0.0)
        for p, _ in preds[t]:
            release(p)
        done(t)

    # Groups no op ever used (a variable without consumers): least-loaded device.
    for g, members in enumerate(deferred_members):
        if members:
            bind(g, min(range(num_devices), key=lambda d: (live[d] / budgets[d], d)))
    makespan = max(finish, default=0.0)
    return Schedule(device, start, finish, timelines.sequence, makespan)


class _Timelines:
    """Per device: its idle gaps (sorted; the last one is open-ended) and its tasks by start."""

    def __init__(self, count: int):
        self.gap_starts: list[list[float]] = [[0.0] for _ in range(count)]
        self.gap_ends: list[list[float]] = [[float("inf")] for _ in range(count)]
        self.task_starts: list[list[float]] = [[] for _ in range(count)]
        self.sequence: list[list[int]] = [[] for _ in range(count)]

    def slot(self, d: int, ready: float, duration: float) -> tuple[float, int]:
        """The earliest start at or after ``ready`` in an idle gap of ``d``, and that gap."""
        gs, ge = self.gap_starts[d], self.gap_ends[d]
        q = bisect_left(ge, ready)
        while True:
            begin = gs[q] if gs[q] > ready else ready
            if begin + duration <= ge[q]:
                return begin, q
            q += 1

    def occupy(self, d: int, t: int, ready: float, duration: float) -> float:
        """Puts task ``t`` in the earliest gap of ``d`` that fits it; returns its start."""
        begin, q = self.slot(d, ready, duration)
        if duration > 0:
            gs, ge = self.gap_starts[d], self.gap_ends[d]
            low, high = gs[q], ge[q]
            pieces = [(a, b) for a, b in ((low, begin), (begin + duration, high)) if b > a]
            gs[q:q + 1] = [a for a, _ in pieces]
            ge[q:q + 1] = [b for _, b in pieces]
        position = bisect_right(self.task_starts[d], begin)
        self.task_starts[d].insert(position, begin)
        self.sequence[d].insert(position, t)
        return begin


@dataclass
class _Groups:
    """The colocation groups a list schedule places whole (see ``_scheduling_groups``)."""

    group_of: list[int]  # per task, its group or -1
    device: list[int]  # per group, its device once bound, or -1
    persistent: list[float]  # per group, the bytes of its variables
    work: list[list[float]]  # per group, per device class, the seconds of its members
    shard_devices: dict[int, list[int]]  # per split op, the devices of its shards


def _scheduling_groups(tg: TaskGraph, graph: OpGraph, fixed: list[int], class_costs: list[list[float]],
                       affinity: str) -> _Groups:
    """Groups of single-copy op tasks that share a colocation group (a variable, its reads and
    updates) and, with layer affinity, a layer; wave, shard and replica copies stay apart (they
    run where their plan puts them)."""
    n = len(tg)
    parent = list(range(n))

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    first_of: dict[tuple[str, str], int] = {}
    grouped = [False] * n
    copies_of_op: dict[int, int] = {}
    for t in range(n):
        if tg.role[t] == "op":
            copies_of_op[tg.base[t]] = copies_of_op.get(tg.base[t], 0) + 1
    for t in range(n):
        if tg.role[t] != "op" or copies_of_op[tg.base[t]] > 1:
            continue
        op = graph.ops[tg.base[t]]
        keys = [("colocation", op.colocation)] if op.colocation is not None else []
        if affinity == "layer" and op.layer is not None:
            keys.append(("layer", op.layer))
        for key in keys:
            grouped[t] = True
            other = first_of.setdefault(key, t)
            parent[root(t)] = root(other)
    group_of = [-1] * n
    group_index: dict[int, int] = {}
    for t in range(n):
        if grouped[t]:
            group_of[t] = group_index.setdefault(root(t), len(group_index))
    count = len(group_index)
    group_device = [-1] * count
    group_persistent = [0.0] * count
    group_work = [[0.0] * len(class_costs) for _ in range(count)]
    shard_devices: dict[int, list[int]] = {}
    for t in range(n):
        g = group_of[t]
        if g >= 0:
            group_persistent[g] += tg.persistent[t]
            if fixed[t] >= 0:
                group_device[g] = fixed[t]
            for c in range(len(class_costs)):
                group_work[g][c] += class_costs[c][t]
        if fixed[t] >= 0 and tg.shard[t] >= 0:
            devices_of = shard_devices.setdefault(tg.base[t], [])
            if fixed[t] not in devices_of:
                devices_of.append(fixed[t])
    return _Groups(group_of, group_device, group_persistent, group_work, shard_devices)


def _fits_nowhere(op_name: str, need: float, largest_free: float, budgets: list[float]) -> InsufficientMemoryError:
    return InsufficientMemoryError(
        f"No device can hold op {op_name!r}: it needs {_bytes(need)} (its outputs, temp bytes, the weights it "
        f"brings and the inputs it receives) but at most {_bytes(max(largest_free, 0.0))} is free on any device "
        f"it may use (budgets {_bytes(min(budgets))} to {_bytes(max(budgets))}). Ways out: more devices, a "
        "smaller batch, Tick-Tock waves (tick_tock='on'), or a larger memory_limit.")


def scheduling_tasks(graph: OpGraph, cluster: Cluster, splits, batch: float) -> tuple[TaskGraph, list[int]]:
    """The tasks a list scheduler places for ``splits``, and which are pinned (the shards)."""
    from .plan import Plan
    from .taskgraph import build_task_graph

    first = cluster.device_names[0]
    provisional = Plan(placement={op.name: first for op in graph.ops}, splits=splits or {})
    tg = build_task_graph(graph, cluster, provisional, batch)
    fixed = [tg.resource[t] if tg.role[t] == "op" and tg.shard[t] >= 0 else -1 for t in range(len(tg))]
    return tg, fixed


def plan_from_schedule(tg: TaskGraph, graph: OpGraph, cluster: Cluster, schedule: Schedule, *,
                       splits, batch: int, algorithm: str):
    """The plan a schedule describes (placement, per-device start order), simulated.

    The order is the schedule's start order on each device; auxiliary copies are left to
    the simulator (they run as soon as they are ready).
    """
    from .baselines import with_prediction
    from .errors import InvalidPlanError
    from .plan import Plan

    names = cluster.device_names
    placement: dict[str, str] = {}
    for t in range(len(tg)):
        if tg.role[t] == "op":
            placement.setdefault(graph.ops[tg.base[t]].name, names[schedule.device[t]])
    order = {names[d]: [tg.names[t] for t in seq if tg.role[t] == "op"]
             for d, seq in enumerate(schedule.sequence) if any(tg.role[t] == "op" for t in seq)}
    plan = Plan(placement={op.name: placement[op.name] for op in graph.ops}, order=order,
                splits=splits or {}, batch_size=batch, algorithm=algorithm)
    try:
        return with_prediction(plan, graph, cluster, batch)
    except InvalidPlanError:
        # The schedule's order met a derived copy in an order the simulator cannot keep:
        # use the order the simulator itself finds for this placement.
        from .simulator import simulate

        unordered = Plan(placement=plan.placement, splits=plan.splits, batch_size=batch, algorithm=algorithm)
        order = simulate(graph, cluster, unordered, batch=batch, memory=False).start_order()
        return with_prediction(Plan(placement=plan.placement, order=order, splits=plan.splits,
                                    batch_size=batch, algorithm=algorithm), graph, cluster, batch)
