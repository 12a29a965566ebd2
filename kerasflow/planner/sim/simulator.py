"""The step simulator: replays one training step of a plan as discrete events.

Each device runs one task at a time, in the plan's order where it gives one, otherwise
the ready task of smallest priority first. A tensor crossing devices occupies its
directed link for ``latency + bytes / bandwidth``, one transfer at a time per link, and is
sent once per destination device. The all-reduce ring of data parallelism is one more
resource. Devices that share compute (``Cluster.shared``: logical CPUs of one host) share it
between the tasks running on them (``sharedpools``). The result is deterministic: the same
inputs give the same figures.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._gc import collector_paused
from .._jsonio import check_number
from ..errors import SimulationError
from ..ir.cluster import Cluster
from ..ir.graph import OpGraph
from ..ir.plan import Plan
from .planchecks import ran_on
from .ring import gather_transfers
from .eventloop import EventLoop, exclusive
from .sharedpools import shared_pools
from .taskgraph import TaskGraph, build_task_graph
from .tasknames import replica_template

__all__ = ["simulate", "simulate_tasks", "run_task_graph", "SimulationResult", "Transfer", "Collective",
           "STEP_OVERHEAD_FIELD"]

# A profile's seconds per step spent outside the step's ops: the training loop's own time around
# each call of the train function (Keras' callbacks and logs), measured inside ``fit``. The same
# for every plan, it is added to every simulated step.
STEP_OVERHEAD_FIELD = "step_overhead_seconds"


@dataclass(frozen=True)
class Transfer:
    """One tensor sent over a link.

    Example:
        >>> Transfer("a", 0, "/GPU:0", "/GPU:1", 0.0, 1e-3, 1e6).end
        0.001
    """

    task: str
    output: int
    src: str
    dst: str
    start: float
    end: float
    bytes: float


@dataclass(frozen=True)
class Collective:
    """One all-reduce the step runs as a collective: one op on each of ``devices``, all summing
    a value of ``bytes`` (a buffer of fused gradients, a batch statistic), priced as a ring
    all-reduce (``TaskGraph`` role ``"allreduce"``).

    Example:
        >>> Collective("fused(2 gradients, first g:0@allreduce)", ("/GPU:0", "/GPU:1"), 0.0, 1e-3, 4e6).bytes
        4000000.0
    """

    task: str
    devices: tuple[str, ...]
    start: float
    end: float
    bytes: float


@dataclass
class SimulationResult:
    """What one simulated step did.

    Attributes:
        makespan: seconds of one step: from the first task's start to the last task's end, plus
            the profile's ``metadata[STEP_OVERHEAD_FIELD]`` (the training loop's own time, when
            the profile was made inside ``fit``).
        task_names, task_start, task_end, task_device: per task (device ``"allreduce-ring"``
            for all-reduce tasks, ``""`` for instant barriers).
        busy: seconds each device computed.
        utilization: ``busy / makespan`` per device.
        link_bytes: bytes moved per ``(src, dst)`` device pair.
        transfers: every transfer between two tasks, in start order.
        collectives: every all-reduce of dense values (``Collective``), the gradients fused
            into buffers as the runtime fuses them (``ring.fusion_buffers``).
        ring_transfers: every piece a ring all-gather of a sparse gradient's rows sends
            (``ring.gather_transfers``). Neither is in ``link_bytes``: the ring's own resource
            times them.
        peak_memory: highest bytes live per device (weights and optimizer slots,
            outputs from their producer's start to their last consumer's end, temp
            bytes during the op).
        memory_timeline: per device ``(times, bytes live after each time)``.
        start_order_replays: whether the same tasks run again with ``start_order()`` as every
            device's order would make the same choices, hence this very timeline. A device
            with an order still runs its ready auxiliary copies (a split, a concat, a sum)
            before the next task of its order; this holds when no op started on a device while
            such a copy waited there. Never on shared compute, which runs devices with an
            order one task at a time and those without several.

    Example:
        >>> from kerasflow.planner import Cluster, Plan, simulate, synthetic
        >>> graph = synthetic.chain_mlp(layers=2)
        >>> cluster = Cluster.preset("2xK80-pcie")
        >>> result = simulate(graph, cluster, Plan(placement={o.name: "/GPU:0" for o in graph.ops}))
        >>> round(result.utilization["/GPU:0"], 6)
        1.0
    """

    makespan: float
    task_names: list[str]
    task_start: list[float]
    task_end: list[float]
    task_device: list[str]
    busy: dict[str, float]
    utilization: dict[str, float]
    link_bytes: dict[tuple[str, str], float]
    transfers: list[Transfer]
    peak_memory: dict[str, float]
    memory_timeline: dict[str, tuple[list[float], list[float]]] = field(repr=False)
    task_role: list[str] = field(default_factory=list, repr=False)
    task_wave: list[int] = field(default_factory=list, repr=False)
    dispatch_order: list[int] = field(default_factory=list, repr=False)
    collectives: list[Collective] = field(default_factory=list, repr=False)
    ring_transfers: list[Transfer] = field(default_factory=list, repr=False)
    start_order_replays: bool = field(default=False, repr=False)

    def times(self) -> dict[str, tuple[float, float]]:
        """Task name -> ``(start, end)``."""
        return {n: (s, e) for n, s, e in zip(self.task_names, self.task_start, self.task_end)}

    def device_of(self) -> dict[str, str]:
        """Task name -> device it ran on."""
        return dict(zip(self.task_names, self.task_device))

    def start_order(self) -> dict[str, list[str]]:
        """Device -> its op tasks in the order they started (what ``Plan.order`` holds).

        Tasks that start at the same instant keep the order the devices dispatched them in,
        which respects their dependencies (zero-cost chains included).
        """
        rows: dict[str, list[str]] = {}
        sequence = self.dispatch_order or sorted(range(len(self.task_names)), key=lambda t: (self.task_start[t], t))
        for t in sequence:
            device = self.task_device[t]
            if not device or device == "allreduce-ring" or (self.task_role and self.task_role[t] != "op"):
                continue
            rows.setdefault(device, []).append(self.task_names[t])
        return rows

    def to_chrome_trace(self) -> dict:
        """The step as a Chrome trace (open in ``chrome://tracing`` or Perfetto).

        Devices are rows of process "devices", links rows of process "links"; times in
        microseconds; a task's wave is in its args and colours alternate per wave.
        """
        events: list[dict[str, Any]] = [
            {"ph": "M", "pid": 0, "name": "process_name", "args": {"name": "devices"}},
            {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "links"}},
        ]
        rows = {d: i for i, d in enumerate(dict.fromkeys(self.task_device))}
        for d, i in rows.items():
            events.append({"ph": "M", "pid": 0, "tid": i, "name": "thread_name", "args": {"name": d or "instant"}})
        colours = ("thread_state_running", "thread_state_iowait", "good", "bad")
        for t, name in enumerate(self.task_names):
            wave = self.task_wave[t] if self.task_wave else -1
            event = {"ph": "X", "pid": 0, "tid": rows[self.task_device[t]], "name": name,
                     "ts": self.task_start[t] * 1e6, "dur": (self.task_end[t] - self.task_start[t]) * 1e6,
                     "args": {"role": self.task_role[t] if self.task_role else "op", "wave": wave}}
            if wave >= 0:
                event["cname"] = colours[wave % len(colours)]
            events.append(event)
        links = {pair: i for i, pair in enumerate(dict.fromkeys((x.src, x.dst) for x in self.transfers))}
        for (src, dst), i in links.items():
            events.append({"ph": "M", "pid": 1, "tid": i, "name": "thread_name", "args": {"name": f"{src} -> {dst}"}})
        for x in self.transfers:
            events.append({"ph": "X", "pid": 1, "tid": links[(x.src, x.dst)], "name": f"{x.task}:{x.output}",
                           "ts": x.start * 1e6, "dur": (x.end - x.start) * 1e6, "args": {"bytes": x.bytes}})
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def save_chrome_trace(self, path) -> None:
        """Writes ``to_chrome_trace()`` as JSON to ``path`` (atomically: a failure leaves nothing)."""
        from .. import _jsonio

        _jsonio.write_atomically(path, json.dumps(self.to_chrome_trace()).encode("utf-8"), what="timeline")


def simulate(graph: OpGraph, cluster: Cluster, plan: Plan, *, batch: float | None = None,
             memory: bool = True, deadline: float = math.inf) -> SimulationResult | None:
    """Simulates one training step of ``plan``.

    Args:
        graph: the step.
        cluster: the devices and links.
        plan: placement, orders, splits, waves or data parallelism.
        batch: the batch to price (default: the plan's, then the graph's).
        memory: compute the memory figures (skip for speed when only time matters).
        deadline: seconds; stop there and return None (see ``simulate_tasks``).

    Returns:
        A ``SimulationResult`` (None only past a ``deadline``).

    Raises:
        InvalidPlanError: the plan does not fit the graph or cluster.

    Example:
        >>> from kerasflow.planner import Cluster, Plan, synthetic
        >>> graph = synthetic.chain_mlp(layers=3)
        >>> cluster = Cluster.preset("2xK80-pcie")
        >>> one = simulate(graph, cluster, Plan(placement={o.name: "/GPU:0" for o in graph.ops}))
        >>> abs(one.makespan - graph.total_work("K80")) < 1e-12
        True
    """
    if batch is not None:
        check_number(batch, "batch", SimulationError, kind="positive", fix="pass the batch to price")
    return simulate_tasks(graph, cluster, build_task_graph(graph, cluster, plan, batch), memory=memory,
                          deadline=deadline)


def simulate_tasks(graph: OpGraph, cluster: Cluster, tasks: TaskGraph, *, memory: bool = True,
                   deadline: float = math.inf) -> SimulationResult | None:
    """Simulates a step already expanded by ``build_task_graph`` (which ``simulate`` does first).

    A task graph is never changed by a run, so one built once can be run again, e.g. with
    orders attached (``planchecks.attach_orders``) after a run without them.

    ``deadline`` (seconds, the profile's step overhead included) stops the run as soon as its
    clock passes it, and returns None: the step cannot end by then, in this run nor in a replay
    of its start order (``start_order_replays``). Candidates that must beat the fastest plan
    found so far use it to stop early. A run in which an op started while a copy waited goes on
    to the end (a replay of its start order may run otherwise), as do devices that share compute.

    Example:
        >>> from kerasflow.planner import Cluster, Plan, synthetic
        >>> from kerasflow.planner.sim.taskgraph import build_task_graph
        >>> graph, cluster = synthetic.chain_mlp(layers=3), Cluster.preset("2xK80-pcie")
        >>> plan = Plan(placement={o.name: "/GPU:0" for o in graph.ops})
        >>> tasks = build_task_graph(graph, cluster, plan)
        >>> result = simulate_tasks(graph, cluster, tasks)
        >>> result.makespan == simulate(graph, cluster, plan).makespan
        True
        >>> simulate_tasks(graph, cluster, tasks, deadline=result.makespan / 2) is None
        True
    """
    cluster = ran_on(tasks, cluster)
    overhead = step_overhead(graph) + cluster.dispatch_for(tasks.used_devices())
    with collector_paused():
        result = run_task_graph(tasks, cluster, memory=memory, deadline=deadline - overhead)
    if result is not None:
        result.makespan += overhead
    return result


def step_overhead(graph: OpGraph) -> float:
    """The profile's training-loop seconds per step (``STEP_OVERHEAD_FIELD``; 0 without one).

    Raises:
        SimulationError: the figure is not a non-negative number.
    """
    seconds = graph.metadata.get(STEP_OVERHEAD_FIELD, 0.0)
    return float(check_number(seconds, STEP_OVERHEAD_FIELD, SimulationError,
                              fix="give the seconds per step outside the step's ops, or remove it"))


def run_task_graph(tg: TaskGraph, cluster: Cluster, *, memory: bool = True,
                   deadline: float = math.inf) -> SimulationResult | None:
    """Runs an expanded ``TaskGraph`` (see ``simulate``) in the event loop (``eventloop.EventLoop``).
    None once the clock passes ``deadline`` while the start order still replays this run (never on
    shared compute): events come in time order, so the step ends after it."""
    cluster = ran_on(tg, cluster)
    ran = EventLoop(tg, cluster, shared_pools if cluster.shared else exclusive).run(deadline)
    if ran is None:
        return None
    start, end, transfers, dispatched, replays = ran
    return _finished(tg, start, end, transfers, dispatched, memory, replays)


def _finished(tg: TaskGraph, start, end, transfers, dispatched, memory: bool, replays: bool) -> SimulationResult:
    if any(e < 0 for e in end):
        raise _deadlock(tg, end)
    result = _result(tg, start, end, transfers, memory)
    result.dispatch_order = dispatched
    result.start_order_replays = replays
    return result


def _deadlock(tg: TaskGraph, end: list[float]) -> SimulationError:
    stuck = [tg.names[t] for t in range(len(tg)) if end[t] < 0]
    return SimulationError(
        f"The step deadlocked: {len(stuck)} task(s) never ran, e.g. {stuck[:3]}. The plan's "
        "device orders contradict the data flow; validate the plan or replan.")


def _result(tg: TaskGraph, start, end, transfers, memory: bool) -> SimulationResult:
    n = len(tg)
    names = tg.devices
    num_devices = len(names)
    makespan = max(end) if n else 0.0
    labels = names + ["allreduce-ring"]
    task_device = [labels[r] if r >= 0 else "" for r in tg.resource]
    busy = {d: 0.0 for d in names}
    for t in range(n):
        r = tg.resource[t]
        if 0 <= r < num_devices:
            busy[names[r]] += tg.duration[t]
    utilization = {d: (b / makespan if makespan > 0 else 0.0) for d, b in busy.items()}
    link_bytes: dict[tuple[str, str], float] = {}
    records = []
    for t, entry, src, dst, begin, arrival, nbytes in transfers:
        pair = (names[src], names[dst])
        link_bytes[pair] = link_bytes.get(pair, 0.0) + nbytes
        records.append(Transfer(tg.names[t], tg.outputs[t][entry][0], pair[0], pair[1], begin, arrival, nbytes))
    peak, timeline = ({d: 0.0 for d in names}, {}) if not memory else _memory(tg, start, end, transfers, makespan)
    task_names, roles, waves = list(tg.names), list(tg.role), list(tg.wave)
    if tg.mirrors:
        start, end = list(start), list(end)
        home = tg.replica_home
        first = names[home]
        local = [t for t in range(n) if tg.resource[t] == home]
        templates = [replica_template(tg.names[t]) for t in local]
        for r, d in enumerate(tg.mirrors, start=1):
            mirror = names[d]
            busy[mirror], utilization[mirror] = busy[first], utilization[first]
            if memory:
                peak[mirror], timeline[mirror] = peak[first], timeline[first]
            for t, (head, tail) in zip(local, templates):
                task_names.append(head if tail is None else f"{head}@r{r}{tail}")
                start.append(start[t])
                end.append(end[t])
                task_device.append(mirror)
                roles.append(tg.role[t])
                waves.append(tg.wave[t])
    return SimulationResult(makespan, task_names, start, end, task_device, busy, utilization,
                            link_bytes, records, peak, timeline, roles, waves,
                            collectives=_collectives(tg, start, end), ring_transfers=_gathers(tg, start, end))


def _collectives(tg: TaskGraph, start, end) -> list[Collective]:
    """Each buffer of fused dense gradients, and any other all-reduced dense value, as one collective."""
    collectives = []
    for t in range(len(tg)):
        if tg.role[t] == "allreduce" and t not in tg.gathered_allreduces:
            fused = tg.gradient_allreduces.get(t, 1)
            name = tg.names[t] if fused == 1 else f"fused({fused} gradients, first {tg.names[t]})"
            collectives.append(Collective(name, tuple(tg.ring_devices), start[t], end[t], tg.out_sizes[t][0]))
    return collectives


def _gathers(tg: TaskGraph, start, end) -> list[Transfer]:
    """The pieces the ring sends to gather each sparse gradient's rows on every replica."""
    transfers = []
    for t in tg.gathered_allreduces:
        transfers.extend(Transfer(tg.names[t], 0, src, dst, start[t], end[t], nbytes)
                         for src, dst, nbytes in gather_transfers(tg.ring_devices, tg.gathered_allreduces[t]))
    return transfers


def _memory_tables(tg: TaskGraph) -> dict:
    """Flat numpy tables of outputs and data edges (built once per task graph)."""
    tables = tg.memory_tables or (tg.shared or {}).get("memory_tables")
    if tables is not None:
        return tables
    out_task, out_size, edge_out, edge_consumer = [], [], [], []
    out_id: dict[tuple[int, int], int] = {}
    for t, sizes in enumerate(tg.out_sizes):
        for k, size in enumerate(sizes):
            out_id[(t, k)] = len(out_task)
            out_task.append(t)
            out_size.append(size)
    for t, entries in enumerate(tg.outputs):
        for k, _, consumers in entries:
            if k >= 0:
                o = out_id[(t, k)]
                for c in consumers:
                    edge_out.append(o)
                    edge_consumer.append(c)
    tables = {
        "out_id": out_id,
        "out_task": np.asarray(out_task, dtype=np.int64),
        "out_size": np.asarray(out_size, dtype=float),
        "edge_out": np.asarray(edge_out, dtype=np.int64),
        "edge_consumer": np.asarray(edge_consumer, dtype=np.int64),
        "temp": np.asarray(tg.temp, dtype=float),
        "persistent": np.asarray(tg.persistent, dtype=float),
    }
    tg.memory_tables = tables
    if tg.shared is not None:
        tg.shared["memory_tables"] = tables
    return tables


def _memory(tg: TaskGraph, start, end, transfers, makespan):
    """Per-device peak and timeline from allocation (+) and free (-) events.

    Weights and slots live all step on their device; temp bytes while their op runs; an
    output from its producer's start until its last consumer on that device and its
    last outgoing transfer have ended; a received copy from its transfer's start until
    its last consumer on the receiving device has ended.
    """
    num_devices = len(tg.devices)
    tables = _memory_tables(tg)
    resource = np.asarray(tg.resource, dtype=np.int64)
    start_a = np.asarray(start, dtype=float)
    end_a = np.asarray(end, dtype=float)
    on_device = (resource >= 0) & (resource < num_devices)
    out_task, out_size = tables["out_task"], tables["out_size"]
    edge_out, edge_consumer = tables["edge_out"], tables["edge_consumer"]
    free = end_a[out_task].copy()
    consumer_res = resource[edge_consumer]
    local = (consumer_res == resource[out_task[edge_out]]) | ~on_device[edge_consumer]
    np.maximum.at(free, edge_out[local], end_a[edge_consumer[local]])
    out_id = tables["out_id"]
    copy_time, copy_bytes, copy_dev = [], [], []
    for t, entry, _, dst, begin, arrival, nbytes in transfers:
        k, _, consumers = tg.outputs[t][entry]
        o = out_id.get((t, k))
        if o is not None and arrival > free[o]:
            free[o] = arrival
        if nbytes:
            last = arrival
            for c in consumers:
                if tg.resource[c] == dst and end[c] > last:
                    last = end[c]
            copy_time += (begin, last)
            copy_bytes += (nbytes, -nbytes)
            copy_dev += (dst, dst)
    temp, persistent = tables["temp"], tables["persistent"]
    out_dev = resource[out_task]
    out_keep = (out_size > 0) & on_device[out_task]
    temp_keep = (temp > 0) & on_device
    pers_keep = (persistent > 0) & on_device
    times = np.concatenate([
        np.zeros(int(pers_keep.sum())), start_a[temp_keep], end_a[temp_keep],
        start_a[out_task[out_keep]], free[out_keep], np.asarray(copy_time, dtype=float)])
    deltas = np.concatenate([
        persistent[pers_keep], temp[temp_keep], -temp[temp_keep],
        out_size[out_keep], -out_size[out_keep], np.asarray(copy_bytes, dtype=float)])
    devices = np.concatenate([
        resource[pers_keep], resource[temp_keep], resource[temp_keep],
        out_dev[out_keep], out_dev[out_keep], np.asarray(copy_dev, dtype=np.int64)])
    # Sorted by device, then time, frees first at equal times (a buffer freed at t is
    # reusable by one allocated at t).
    idx = np.lexsort((deltas, times, devices))
    times, deltas, devices = times[idx], deltas[idx], devices[idx]
    level = np.cumsum(deltas)
    bounds = np.searchsorted(devices, np.arange(num_devices + 1))
    peak, timeline = {}, {}
    for d, name in enumerate(tg.devices):
        lo, hi = bounds[d], bounds[d + 1]
        if lo == hi:
            peak[name] = 0.0
            timeline[name] = ([0.0, makespan], [0.0, 0.0])
            continue
        base = level[lo - 1] if lo > 0 else 0.0
        t_d, x_d = times[lo:hi], level[lo:hi] - base
        peak[name] = float(x_d.max())
        keep = np.append(t_d[1:] != t_d[:-1], True)
        timeline[name] = (t_d[keep].tolist(), np.maximum(x_d[keep], 0.0).tolist())
    return peak, timeline
