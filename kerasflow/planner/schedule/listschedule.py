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
from operator import sub

from ..errors import InsufficientMemoryError
from ..ir.cluster import Cluster
from ..ir.graph import OpGraph
from ..sim.taskgraph import TaskGraph
from .ranks import TaskCosts, predecessors, topological_tasks

__all__ = ["Schedule", "list_schedule", "memory_budgets", "DEFAULT_MEMORY_HEADROOM"]

# Fraction of each device's memory the planner leaves free: TensorFlow's allocator
# fragments, cuDNN/cuBLAS take workspaces and the runtime keeps buffers of its own.
DEFAULT_MEMORY_HEADROOM = 0.1


def memory_budgets(cluster: Cluster, memory_limit: float | None = None,
                   headroom: float = DEFAULT_MEMORY_HEADROOM, reserved: float = 0.0) -> list[float]:
    """Bytes the planner may use on each device.

    Args:
        cluster: the devices.
        memory_limit: a cap in bytes for every device (e.g. to plan for a smaller card).
        headroom: the fraction of memory left free (default 10 %).
        reserved: bytes every device keeps off its budget for the step's temporary memory, which
            no op's tensors show (``graphtables.temporary_bytes``: a GPU profile's measured
            peak beyond the modelled one); any device may run the op that needs it.

    Example:
        >>> memory_budgets(Cluster.preset("2xK80-pcie"), memory_limit=1e9)
        [900000000.0, 900000000.0]
        >>> memory_budgets(Cluster.preset("2xK80-pcie"), memory_limit=1e9, reserved=1e8)
        [800000000.0, 800000000.0]
    """
    if not 0 <= headroom < 1:
        raise InsufficientMemoryError(f"memory headroom must be in [0, 1); received {headroom!r}.")
    budgets = []
    for device in cluster.devices:
        memory = device.memory if memory_limit is None else min(device.memory, memory_limit)
        budgets.append(max(memory * (1.0 - headroom) - reserved, 0.0))
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
    costs = costs or TaskCosts(tg, graph, cluster, fixed)
    fixed = fixed or [-1] * len(tg)
    return _ListScheduler(tg, graph, cluster, costs, fixed, preferred or {},
                          budgets or memory_budgets(cluster), affinity).run(priority)


class _ListScheduler:
    """The state of one list schedule: where tasks are, what each device holds, what is waiting.

    ``run`` takes the ready task of highest priority, then either defers it (a variable or
    its read: it waits for the op that uses it, see ``_defer``), or chooses its device
    (``_choose``) and commits it there with its input transfers (``_commit``).
    """

    def __init__(self, tg: TaskGraph, graph: OpGraph, cluster: Cluster, costs: TaskCosts, fixed: list[int],
                 preferred: dict[int, int], budgets: list[float], affinity: str):
        n = len(tg)
        self.tg, self.graph, self.fixed, self.preferred, self.budgets = tg, graph, fixed, preferred, budgets
        self.num_devices = len(cluster)
        self.class_costs = costs.by_class
        self.device_class = costs.device_class
        self.preds = predecessors(tg)
        self.topo_position = [0] * n
        for position, t in enumerate(topological_tasks(tg)):
            self.topo_position[t] = position
        groups = _scheduling_groups(tg, graph, fixed, self.class_costs, affinity)
        self.group_of, self.group_device, self.group_persistent = groups.group_of, groups.device, groups.persistent
        self.group_work, self.shard_devices = groups.work, groups.shard_devices
        self.homed_work = [0.0] * self.num_devices
        self.deferred_members: list[list[int]] = [[] for _ in self.group_device]
        self.deferred_cost = [[0.0] * len(self.class_costs) for _ in self.group_device]
        self.is_deferred = [False] * n
        self.device = [-1] * n
        self.start = [0.0] * n
        self.finish = [0.0] * n
        self.timelines = _Timelines(self.num_devices)
        self.live = [0.0] * self.num_devices
        self.out_total = [sum(sizes) for sizes in tg.out_sizes]
        self.waiting_consumers = [sum(len(c) for _, _, c in entries) for entries in tg.outputs]
        # producer -> [(device, bytes, arrival)] of the copies of its outputs sent to other devices
        self.copies: list[list[tuple[int, float, float]]] = [[] for _ in range(n)]
        # Each directed link carries one transfer at a time, as in the simulator.
        self.link_free = [[0.0] * self.num_devices for _ in range(self.num_devices)]
        self.missing = list(tg.npreds)
        self.heap: list[tuple[float, int, int]] = []
        self._arrival_on = _arrival_function(self.device, self.finish, self.copies, self.link_free,
                                             cluster.latency_matrix, cluster.inverse_bandwidth_matrix)
        # Where a transfer's cores copy it (Cluster.core_share), the receiving device spends that
        # share of it, as the simulator has it: an op fed from another host takes that much longer.
        self.copying_share = cluster.core_share_matrix if cluster.core_share else None
        self.gap, self.inverse = cluster.gap_matrix, cluster.inverse_bandwidth_matrix

    def run(self, priority: list[float]) -> Schedule:
        """Schedules every task, highest ``priority`` first among the ready ones."""
        self.priority = priority
        group_of, group_device, fixed = self.group_of, self.group_device, self.fixed
        preds, is_deferred, shard_of = self.preds, self.is_deferred, self.tg.shard
        self.heap = [(-priority[t], self.topo_position[t], t) for t in range(len(self.tg)) if self.missing[t] == 0]
        heapq.heapify(self.heap)
        while self.heap:
            t = heapq.heappop(self.heap)[2]
            g = group_of[t]
            if g >= 0 and group_device[g] < 0 and fixed[t] < 0 and all(group_of[p] == g for p, _ in preds[t]):
                self._defer(t, g)
                continue
            pending_groups = {group_of[p] for p, _ in preds[t] if is_deferred[p]}
            if g >= 0 and group_device[g] < 0:
                pending_groups.add(g)
            if fixed[t] >= 0 and shard_of[t] >= 0 and pending_groups:
                # A split layer's weights: homed by load among its shards' devices, then copied.
                for x in sorted(pending_groups):
                    self._bind(x, self._home_by_load(x, self.shard_devices[self.tg.base[t]]))
                pending_groups = set()
            d = self._choose(t, g, pending_groups)
            for x in sorted(pending_groups):
                self._bind(x, d)
            self._commit(t, d, g)
        # Groups no op ever used (a variable without consumers): least-loaded device.
        for g, members in enumerate(self.deferred_members):
            if members:
                self._bind(g, min(range(self.num_devices), key=lambda d: (self.live[d] / self.budgets[d], d)))
        return Schedule(self.device, self.start, self.finish, self.timelines.sequence, max(self.finish, default=0.0))

    def _defer(self, t: int, g: int) -> None:
        """A variable or a read of it: it waits, unplaced, for the op that uses it."""
        self.is_deferred[t] = True
        self.deferred_members[g].append(t)
        for c, by_task in enumerate(self.class_costs):
            self.deferred_cost[g][c] += by_task[t]
        self._done(t)

    def _choose(self, t: int, g: int, pending_groups: set[int]) -> int:
        """The device where ``t`` finishes earliest (its preferred one first) with room for it."""
        tg, class_costs, device_class, preds = self.tg, self.class_costs, self.device_class, self.preds
        is_deferred, group_of, deferred_cost = self.is_deferred, self.group_of, self.deferred_cost
        arrival_on, slot, live, budgets = self._arrival_on, self.timelines.slot, self.live, self.budgets
        if self.fixed[t] >= 0:
            candidates = [self.fixed[t]]
        elif g >= 0 and self.group_device[g] >= 0:
            candidates = [self.group_device[g]]
        else:
            candidates = range(self.num_devices)
        own_bytes = self.out_total[t] + tg.temp[t] + sum(self.group_persistent[x] for x in pending_groups) + (
            tg.persistent[t] if g < 0 else 0.0)
        preferred = self.preferred.get(t)
        best = None
        largest_free = -1.0
        smallest_need = float("inf")
        for d in candidates:
            ready = 0.0
            received = 0.0
            copying = 0.0
            for p, nbytes in preds[t]:
                if is_deferred[p]:
                    arrival = deferred_cost[group_of[p]][device_class[d]]
                else:
                    arrival, new = arrival_on(p, nbytes, d)
                    if new:
                        received += nbytes
                        if self.copying_share is not None:
                            copying += self._copying(p, nbytes, d)
                if arrival > ready:
                    ready = arrival
            need = own_bytes + received
            free = budgets[d] - live[d]
            if need > free:
                largest_free = max(largest_free, free)
                smallest_need = min(smallest_need, need)
                continue
            duration = class_costs[device_class[d]][t] + copying
            begin = slot(d, ready, duration)
            key = (0 if preferred == d else 1, begin + duration, d) if preferred is not None else (
                begin + duration, d)
            if best is None or key < best[0]:
                best = (key, d)
        if best is None:
            raise _fits_nowhere(self.graph.ops[tg.base[t]].name if tg.base[t] >= 0 else tg.names[t], smallest_need,
                                largest_free, budgets)
        return best[1]

    def _commit(self, t: int, d: int, g: int) -> None:
        """Places ``t`` on ``d`` with its input transfers (deferred inputs are placed for real now)."""
        ready = 0.0
        copying = 0.0
        for p, nbytes in self.preds[t]:
            arrival, new = self._arrival_on(p, nbytes, d)
            if new:
                if self.copying_share is not None:
                    copying += self._copying(p, nbytes, d)
                self.link_free[self.device[p]][d] = arrival
                self.copies[p].append((d, nbytes, arrival))
                self.live[d] += nbytes
            if arrival > ready:
                ready = arrival
        self._place(t, d, ready, copying)
        self.live[d] += self.out_total[t] + (self.tg.persistent[t] if g < 0 else 0.0)
        for p, _ in self.preds[t]:
            self._release(p)
        self._done(t)

    def _copying(self, p: int, nbytes: float, d: int) -> float:
        """Seconds device ``d``'s cores spend receiving ``nbytes`` of ``p``'s from its device."""
        src = self.device[p]
        return self.copying_share[src][d] * (self.gap[src][d] + nbytes * self.inverse[src][d])

    def _place(self, t: int, d: int, ready: float, copying: float = 0.0) -> None:
        duration = self.class_costs[self.device_class[d]][t] + copying
        begin = self.timelines.occupy(d, t, ready, duration)
        self.device[t], self.start[t], self.finish[t] = d, begin, begin + duration

    def _release(self, t: int) -> None:
        """A consumer of ``t`` was scheduled: free t's outputs once all consumers are."""
        self.waiting_consumers[t] -= 1
        if self.waiting_consumers[t] == 0:
            if self.device[t] >= 0:
                self.live[self.device[t]] -= self.out_total[t]
            for d, nbytes, _ in self.copies[t]:
                self.live[d] -= nbytes

    def _bind(self, g: int, d: int) -> None:
        """Puts group ``g`` on ``d``, placing its deferred members in the order they came."""
        self.group_device[g] = d
        self.live[d] += self.group_persistent[g]
        self.homed_work[d] += self.group_work[g][self.device_class[d]]
        ready = 0.0
        for member in self.deferred_members[g]:
            member_ready = max((self.finish[p] for p, _ in self.preds[member] if self.device[p] >= 0), default=0.0)
            self._place(member, d, max(ready, member_ready))
            ready = self.finish[member]
            self.is_deferred[member] = False
            self.live[d] += self.out_total[member]
            for p, _ in self.preds[member]:
                self._release(p)
        self.deferred_members[g].clear()

    def _home_by_load(self, g: int, devices: list[int]) -> int:
        """The device of ``devices`` with the least group work once ``g`` joins it (memory
        permitting; the first such device on a tie)."""
        roomy = [d for d in devices if self.live[d] + self.group_persistent[g] <= self.budgets[d]] or devices
        return min(roomy, key=lambda d: (self.homed_work[d] + self.group_work[g][self.device_class[d]],
                                         devices.index(d)))

    def _done(self, t: int) -> None:
        """``t`` is scheduled (or deferred): its consumers with no other missing input become ready."""
        missing, priority, topo_position = self.missing, self.priority, self.topo_position
        for _, _, consumers in self.tg.outputs[t]:
            for c in consumers:
                missing[c] -= 1
                if missing[c] == 0:
                    heapq.heappush(self.heap, (-priority[c], topo_position[c], c))


def _arrival_function(device: list[int], finish: list[float], copies: list[list[tuple[int, float, float]]],
                      link_free: list[list[float]], latency, inverse):
    """``arrival_on(p, nbytes, d)``: when p's output can be on device d, and whether that needs
    a new transfer. A closure over the scheduler's lists: it runs once per input per device
    tried, the planner's hottest call."""

    def arrival_on(p: int, nbytes: float, d: int) -> tuple[float, bool]:
        dp = device[p]
        if dp == d:
            return finish[p], False
        for x, _, arrival in copies[p]:
            if x == d:
                return arrival, False
        begin = finish[p] if finish[p] > link_free[dp][d] else link_free[dp][d]
        return begin + latency[dp][d] + nbytes * inverse[dp][d], True

    return arrival_on


class _Timelines:
    """Per device: its idle gaps, sorted, in blocks of at most ``2 * BLOCK`` (the last gap is
    open-ended), and its tasks by start.

    A long task ready early would otherwise step through every short gap after its ready time;
    each block keeps its longest gap, so the search passes a block too short for the task in one
    step (the gaps are the same as in one sorted list: only the search is shorter).
    """

    BLOCK = 64

    def __init__(self, count: int):
        self.gap_starts: list[list[list[float]]] = [[[0.0]] for _ in range(count)]
        self.gap_ends: list[list[list[float]]] = [[[float("inf")]] for _ in range(count)]
        self.last_ends: list[list[float]] = [[float("inf")] for _ in range(count)]  # per block, its last gap's end
        self.longest: list[list[float]] = [[float("inf")] for _ in range(count)]  # per block, its longest gap
        self.task_starts: list[list[float]] = [[] for _ in range(count)]
        self.sequence: list[list[int]] = [[] for _ in range(count)]

    def slot(self, d: int, ready: float, duration: float) -> float:
        """The earliest start at or after ``ready`` in an idle gap of ``d``."""
        return self._find(d, ready, duration)[0]

    def _find(self, d: int, ready: float, duration: float) -> tuple[float, int, int]:
        """``slot``'s start, and the block and position of its gap."""
        last_ends = self.last_ends[d]
        b = bisect_left(last_ends, ready)
        gs, ge = self.gap_starts[d][b], self.gap_ends[d][b]
        q = bisect_left(ge, ready)
        begin = gs[q] if gs[q] > ready else ready
        if begin + duration <= ge[q]:
            return begin, b, q
        longest = self.longest[d]
        # Later gaps start after ``ready``. A block is passed only when its longest gap is
        # shorter than the task by more than rounding (a gap's length, end - start, is off by at
        # most an ulp of its end: under 1e-9 s on any timeline shorter than 10^6 s), so the gap
        # found is the one a scan of every gap finds.
        cutoff = duration * (1 - 1e-9) - 1e-9
        q += 1
        while True:
            for q in range(q, len(gs)):
                if gs[q] + duration <= ge[q]:
                    return gs[q], b, q
            b += 1
            while longest[b] < cutoff:
                b += 1
            gs, ge, q = self.gap_starts[d][b], self.gap_ends[d][b], 0

    def occupy(self, d: int, t: int, ready: float, duration: float) -> float:
        """Puts task ``t`` in the earliest gap of ``d`` that fits it; returns its start."""
        begin, b, q = self._find(d, ready, duration)
        if duration > 0:
            self._fill(d, b, q, begin, begin + duration)
        position = bisect_right(self.task_starts[d], begin)
        self.task_starts[d].insert(position, begin)
        self.sequence[d].insert(position, t)
        return begin

    def _fill(self, d: int, b: int, q: int, begin: float, end: float) -> None:
        """Takes ``[begin, end)`` out of gap ``q`` of block ``b``: what is left of it stays idle."""
        blocks_starts, blocks_ends, longest = self.gap_starts[d], self.gap_ends[d], self.longest[d]
        gs, ge = blocks_starts[b], blocks_ends[b]
        low, high = gs[q], ge[q]
        pieces = [(x, y) for x, y in ((low, begin), (end, high)) if y > x]
        gs[q:q + 1] = [x for x, _ in pieces]
        ge[q:q + 1] = [y for _, y in pieces]
        if not gs:  # never the last block: it holds the open-ended gap
            for table in (blocks_starts, blocks_ends, self.last_ends[d], longest):
                del table[b]
            return
        if len(gs) > 2 * self.BLOCK:
            blocks_starts.insert(b + 1, gs[self.BLOCK:])
            blocks_ends.insert(b + 1, ge[self.BLOCK:])
            del gs[self.BLOCK:], ge[self.BLOCK:]
            self.last_ends[d].insert(b + 1, 0.0)
            longest.insert(b + 1, 0.0)
            self._measure(d, b + 1)
            self._measure(d, b)
            return
        self.last_ends[d][b] = ge[-1]
        # What is left of a gap is shorter than it: only the longest one's block needs measuring
        # again (the last block's longest is the open-ended gap, always).
        if high - low >= longest[b] and b < len(longest) - 1:
            self._measure(d, b)

    def _measure(self, d: int, b: int) -> None:
        """Reads block ``b``'s last gap end and longest gap again."""
        gs, ge = self.gap_starts[d][b], self.gap_ends[d][b]
        self.last_ends[d][b] = ge[-1]
        self.longest[d][b] = max(map(sub, ge, gs))


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
    from ..ir.plan import Plan
    from ..sim.taskgraph import build_task_graph

    first = cluster.device_names[0]
    provisional = Plan(placement={op.name: first for op in graph.ops}, splits=splits or {})
    tg = build_task_graph(graph, cluster, provisional, batch, hosted=False)  # the host's ops are pinned later
    fixed = [tg.resource[t] if tg.role[t] == "op" and tg.shard[t] >= 0 else -1 for t in range(len(tg))]
    return tg, fixed


def plan_from_schedule(tg: TaskGraph, graph: OpGraph, cluster: Cluster, schedule: Schedule, *,
                       splits, batch: int, algorithm: str, unless_slower_than: float | None = None):
    """The plan a schedule describes (placement, per-device start order), simulated (None once
    the simulation passes ``unless_slower_than`` seconds, as ``predict.with_prediction``).

    The order is the schedule's start order on each device; auxiliary copies are left to
    the simulator (they run as soon as they are ready).
    """
    from ..sim.predict import with_prediction
    from ..errors import InvalidPlanError
    from ..ir.plan import Plan

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
        return with_prediction(plan, graph, cluster, batch, unless_slower_than=unless_slower_than)
    except InvalidPlanError:
        # The schedule's order met a derived copy in an order the simulator cannot keep:
        # use the order the simulator itself finds for this placement.
        from ..sim.simulator import simulate

        unordered = Plan(placement=plan.placement, splits=plan.splits, batch_size=batch, algorithm=algorithm)
        order = simulate(graph, cluster, unordered, batch=batch, memory=False).start_order()
        return with_prediction(Plan(placement=plan.placement, order=order, splits=plan.splits,
                                    batch_size=batch, algorithm=algorithm), graph, cluster, batch,
                               unless_slower_than=unless_slower_than)
