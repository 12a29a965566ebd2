"""The simulator's event loop: list scheduling of a ``TaskGraph``'s tasks over devices and links.

A device runs its tasks in its order where it has one, otherwise the ready task of smallest
priority first; an auxiliary copy (a split, a concat, a sum) runs as soon as it is ready. A tensor
crossing devices arrives ``latency + bytes / bandwidth`` after it starts and holds its directed link
meanwhile, one transfer at a time per link (between hosts with a ``Cluster.message_gap``, only
for that gap and its bytes: the rest of its latency overlaps the transfers after it), and is
sent once per destination device. Where ``Cluster.core_share`` is set, each of a transfer's two
devices owes that share of the time it holds its link (its cores copy it), and the next task it
starts ends that much later. How many tasks run at once and how long
each takes is the ``Compute``'s: on independent devices (``exclusive``) one task at a time per
device, for its duration; on devices that share compute, ``sharedpools.shared_pools``.

The loop runs once per simulated plan, the planner's hot path: its per-task steps are closures,
which read their tables without attribute look-ups.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Callable, NamedTuple

from ..ir.cluster import Cluster
from .taskgraph import TaskGraph, queued_tasks

__all__ = ["EventLoop", "Compute", "exclusive"]


class Compute(NamedTuple):
    """How a run's resources take tasks, and how long a task takes beside the others.

    Attributes:
        units: per resource (devices, then the all-reduce ring), what a task becoming ready there
            wakes: the resource itself, or the pool of compute it shares.
        fill: ``fill(woken units, now)`` starts the tasks the woken units may start now (each
            adds to ``EventLoop.running`` and pushes the task's end event).
        leave: None where a task's end never moves; else ``leave(unit, now, -1, task)`` as the
            task ends (``EventLoop.running`` counts it out after), which may move the ends of
            the unit's other tasks: each pushed end event's seq is then kept in
            ``EventLoop.latest``, and the loop skips the superseded ones.
        replays: whether a run of the start order makes the same choices (never where a device
            runs several tasks at once).

    Example:
        >>> from kerasflow.planner import Cluster, Plan, synthetic
        >>> from kerasflow.planner.sim.taskgraph import build_task_graph
        >>> graph, cluster = synthetic.chain_mlp(layers=2), Cluster.preset("2xK80-pcie")
        >>> tg = build_task_graph(graph, cluster, Plan(placement={o.name: "/GPU:0" for o in graph.ops}))
        >>> EventLoop(tg, cluster, exclusive).compute.units
        [0, 1, 2]
    """

    units: list[int]
    fill: Callable[[list[int], float], None]
    leave: Callable[[int, float, int, int], None] | None
    replays: bool


class EventLoop:
    """One run of a ``TaskGraph`` on a cluster: readiness, device queues and transfers, with its
    ``Compute`` (``exclusive``, or ``sharedpools.shared_pools`` where the cluster shares compute)
    starting tasks.

    Args:
        tg: the tasks (``taskgraph.build_task_graph``).
        cluster: its devices and links.
        compute: makes the run's ``Compute`` from the loop (``simulator.run_task_graph`` passes
            ``sharedpools.shared_pools`` where the cluster shares compute, else ``exclusive``).

    Example:
        >>> from kerasflow.planner import Cluster, Plan, synthetic
        >>> from kerasflow.planner.sim.taskgraph import build_task_graph
        >>> graph, cluster = synthetic.chain_mlp(layers=2), Cluster.preset("2xK80-pcie")
        >>> tg = build_task_graph(graph, cluster, Plan(placement={o.name: "/GPU:0" for o in graph.ops}))
        >>> start, end, transfers, dispatched, replays = EventLoop(tg, cluster, exclusive).run()
        >>> abs(max(end) - graph.total_work("K80")) < 1e-12, transfers, replays
        (True, [], True)
    """

    def __init__(self, tg: TaskGraph, cluster: Cluster, compute: Callable[[EventLoop], Compute]):
        n, resources = len(tg), len(tg.devices) + 1
        self.tg, self.cluster = tg, cluster
        self.start = [0.0] * n
        self.end = [-1.0] * n  # -1: never ran
        self.running = [0] * resources  # per resource, the tasks it runs now
        self.dispatched: list[int] = []  # device tasks in the order they started (ties kept causal)
        self.events: list[tuple[float, int, int]] = []  # (time, seq, task, or ~task once its inputs are in)
        self.next_seq = itertools.count(1).__next__
        self.latest = [0] * n  # where ends move (``Compute.leave``): per task, the seq of its end event that holds
        self.woken: list[int] = []  # the units (``Compute.units``) to fill once this instant's events are in
        self.queues: list[list] = [[] for _ in range(resources)]  # per resource, (priority, task) ready
        self.is_ready = [False] * n  # for the tasks of an order (never queued)
        # Per resource, its auxiliary copies waiting in its queue; whether an op ever started past one.
        self.is_copy = [role != "op" for role in tg.role]
        self.copies_waiting = [0] * resources
        # Per resource, the seconds of transfers its cores copied since its last task started.
        self.owed = [0.0] * resources
        self.op_passed_a_copy = [False]  # a list: the closures set it without holding the loop (no cycle)
        self.pick = self._picker()
        self.compute = compute(self)
        self.make_ready = self._readier()

    def _picker(self) -> Callable[[int], int]:
        """``pick(r)``: takes resource ``r``'s next task: its queue's first, else its order's next
        once ready; -1 for none."""
        queues, is_ready, is_copy, copies_waiting = self.queues, self.is_ready, self.is_copy, self.copies_waiting
        orders, position, pop, passed = list(self.tg.orders) + [None], [0] * len(queues), heapq.heappop, self.op_passed_a_copy

        def pick(r: int) -> int:
            queue = queues[r]
            if queue:
                t = pop(queue)[1]
                if is_copy[t]:
                    copies_waiting[r] -= 1
                elif copies_waiting[r]:
                    passed[0] = True
                return t
            order = orders[r]
            if order is None:
                return -1
            p = position[r]
            if p >= len(order) or not is_ready[order[p]]:
                return -1
            position[r] = p + 1
            return order[p]

        return pick

    def _readier(self) -> Callable[[int, float], None]:
        """``make_ready(c, now)``: task ``c``'s inputs are all in: it joins its resource's queue
        (or order) and wakes its unit; an instant task (a wave barrier) ends at once."""
        resource, priority, queued, units = self.tg.resource, self.tg.priority, queued_tasks(self.tg), self.compute.units
        start, events, next_seq, woken, push = self.start, self.events, self.next_seq, self.woken, heapq.heappush
        queues, is_ready, is_copy, copies_waiting = self.queues, self.is_ready, self.is_copy, self.copies_waiting

        def make_ready(c: int, now: float) -> None:
            r = resource[c]
            if r < 0:
                start[c] = now
                push(events, (now, next_seq(), c))
            elif queued[c]:
                push(queues[r], (priority[c], c))
                copies_waiting[r] += is_copy[c]
                woken.append(units[r])
            else:
                is_ready[c] = True
                woken.append(units[r])

        return make_ready

    def run(self, deadline: float = math.inf) -> tuple[list[float], list[float], list[tuple], list[int], bool] | None:
        """Runs every task.

        Args:
            deadline: seconds; None once the clock passes it while the start order still replays
                this run (``SimulationResult.start_order_replays``): events come in time order, so
                the step ends after it.

        Returns:
            ``(start, end, transfers, dispatch order, whether the start order replays)``: an end
            of -1 marks a task that never ran; a transfer is ``(task, output entry, src, dst,
            begin, arrival, bytes)``.
        """
        tg, events, woken, make_ready, running, end = self.tg, self.events, self.woken, self.make_ready, self.running, self.end
        num_devices, resource, outputs, (units, fill, leave, replays) = len(tg.devices), tg.resource, tg.outputs, self.compute
        latency, gap, inverse_bw = self.cluster.latency_matrix, self.cluster.gap_matrix, self.cluster.inverse_bandwidth_matrix
        share, owed = self.cluster.core_share_matrix, self.owed
        missing, ready_at, transfers, latest = list(tg.npreds), [0.0] * len(tg), [], self.latest
        link_free = [[0.0] * num_devices for _ in range(num_devices)]
        push, pop, next_seq = heapq.heappush, heapq.heappop, self.next_seq
        deadline = deadline if replays else math.inf
        for t in range(len(tg)):
            if missing[t] == 0:
                make_ready(t, 0.0)
        fill(woken, 0.0)
        woken.clear()

        while events:
            now, seq, t = pop(events)
            if now > deadline and not self.op_passed_a_copy[0]:
                return None
            if t < 0:  # the inputs of task ~t have arrived
                make_ready(~t, now)
            else:
                src = resource[t]
                if src >= 0:
                    if leave is not None:
                        if seq != latest[t]:
                            continue  # superseded: the task's end moved since this event was pushed
                        leave(units[src], now, -1, t)
                    running[src] -= 1
                end[t] = now
                on_device = 0 <= src < num_devices
                entry_index = -1
                for k, nbytes, consumers in outputs[t]:
                    entry_index += 1
                    arrivals = None
                    for c in consumers:
                        dst = resource[c]
                        if dst == src or dst < 0 or dst >= num_devices or not on_device:
                            arrival = now
                        else:
                            if arrivals is None:
                                arrivals = {}
                            arrival = arrivals.get(dst)
                            if arrival is None:
                                row = link_free[src]
                                begin = now if now > row[dst] else row[dst]
                                wire = nbytes * inverse_bw[src][dst]
                                arrival = begin + latency[src][dst] + wire
                                row[dst] = begin + gap[src][dst] + wire
                                if share[src][dst]:
                                    copying = share[src][dst] * (gap[src][dst] + wire)
                                    owed[src] += copying
                                    owed[dst] += copying
                                arrivals[dst] = arrival
                                transfers.append((t, entry_index, src, dst, begin, arrival, nbytes))
                        if arrival > ready_at[c]:
                            ready_at[c] = arrival
                        left = missing[c] - 1
                        missing[c] = left
                        if left == 0:
                            when = ready_at[c]
                            if when <= now:
                                make_ready(c, now)
                            else:
                                push(events, (when, next_seq(), ~c))
                if src >= 0:
                    woken.append(units[src])
            # Units take their next task only once every event at this instant is in, so a
            # choice sees all tasks that became ready at the same time (wave barriers included).
            if woken and (not events or events[0][0] > now):
                fill(woken, now)
                woken.clear()
        return self.start, end, transfers, self.dispatched, replays and not self.op_passed_a_copy[0]


def exclusive(loop: EventLoop) -> Compute:
    """The compute of independent devices: each runs one task at a time, for its duration, taking
    the next when woken in the order the woken devices came (the all-reduce ring is one more).

    Example:
        >>> from kerasflow.planner import Cluster, Plan, synthetic
        >>> from kerasflow.planner.sim.taskgraph import build_task_graph
        >>> graph, cluster = synthetic.chain_mlp(layers=2), Cluster.preset("2xK80-pcie")
        >>> tg = build_task_graph(graph, cluster, Plan(placement={o.name: "/GPU:0" for o in graph.ops}))
        >>> exclusive(EventLoop(tg, cluster, exclusive)).replays
        True
    """
    running, pick, start, dispatched = loop.running, loop.pick, loop.start, loop.dispatched
    events, next_seq, duration, push, owed = loop.events, loop.next_seq, loop.tg.duration, heapq.heappush, loop.owed

    def fill(woken: list[int], now: float) -> None:
        for r in woken:
            if not running[r]:
                t = pick(r)
                if t >= 0:
                    running[r] = 1
                    start[t] = now
                    dispatched.append(t)
                    push(events, (now + duration[t] + owed[r], next_seq(), t))
                    owed[r] = 0.0

    return Compute(list(range(len(running))), fill, None, True)
