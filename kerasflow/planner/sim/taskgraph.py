"""Expands (graph, cluster, plan) into the concrete tasks of one step: what the simulator runs.

A plan's splits, waves and replicas turn one op into several copies, and add the work
they cost: ``split`` copies of a tensor into shards, ``concat``/``sum`` of shard outputs
(activations are concatenated, gradients summed), an ``allreduce`` (a collective, priced as
the ring algorithm runs it) per fused buffer of gradients for data parallelism (it starts when
the buffer's last gradient is ready, as the runtime's does), and a ``barrier`` that holds a
wave's forward pass until the previous wave's forward pass is done. Everything here is plain lists indexed by task id, because
the simulator's inner loop reads them millions of times.
"""

from __future__ import annotations

from typing import Sequence

from .._gc import collector_paused
from ..ir.cluster import Cluster
from ..ir.graph import Affine, OpGraph
from ..ir.graphtables import (batch_inputs, batch_statistics, durations, folded_ops, host_held_ops, host_ops,
                              split_groups, static_tables)
from ..ir.plan import Plan
from .hostops import host_seconds, on_host
from .planchecks import attach_orders, resolve_plan
from .ring import FUSION_BUFFER_BYTES, fusion_buffers
from .tasknames import auxiliary_name, barrier_name, copy_name

__all__ = ["TaskGraph", "build_task_graph", "busiest_device_seconds", "longest_chain_seconds", "queued_tasks",
           "AUXILIARY_ROLES"]


AUXILIARY_ROLES = ("split", "concat", "sum", "allreduce", "barrier")

# Backward ops whose outputs reach the update without being a weight's gradient (a sparse
# gradient's dense shape): the runtime does not fuse them with the gradients.
_NOT_GRADIENTS = ("Const", "Shape")


class TaskGraph:
    """The expanded step: one entry per task, in parallel lists.

    Attributes:
        names: task names (op names, suffixed ``@r``/``@w``/``@s`` for copies).
        base: index of the op in the graph, or -1 for an auxiliary task.
        role: ``"op"`` or one of ``AUXILIARY_ROLES``.
        resource: device index; ``len(devices)`` is the all-reduce ring; -1 is instant.
        duration: seconds.
        outputs: per task, ``[(output index, bytes, consumer ids), ...]``; one transfer
            per entry and destination device.
        out_sizes: per task, the bytes of each output (for memory).
        temp, persistent: bytes per task.
        npreds: number of incoming edges per task.
        wave, replica, shard: copy indices per task (-1 when not a copy).
        priority: smaller runs first when a device picks among ready tasks.
        size: what a task's duration scales with: the samples an op task processes, the
            bytes a split/concat/sum reads and writes (0 for the rest).
        orders: per device, the task ids of its order, or None (priority mode).
        devices: the cluster's device names.
        mirrors, replica_home: with data parallelism over identical devices only replica 0
            is simulated (on ``replica_home``); ``mirrors`` are the other replicas' devices.
        ring_devices: the all-reduce ring's devices, in ring order (empty without data parallelism).
        gradient_allreduces: all-reduce task of a buffer of weight gradients -> how many
            gradients it fuses (``ring.fusion_buffers``); the other all-reduces reduce forward
            values (a loss, a metric), or gather.
        gathered_allreduces: all-reduce task -> the bytes of each replica's rows, for sparse
            gradients (an embedding's), which the ring gathers instead of summing.
        memory_tables, shared: tables the simulator's memory pass builds once, and the
            per-graph cache they are kept in when the tasks are the graph's own ops.
        derived: tables read off the tasks' edges alone (not their devices or durations),
            kept on first use (``ranks.topological_tasks``, ``ranks.predecessors``): in the
            per-graph cache when the tasks are the graph's own ops, so every such plan shares them.
    """

    def __init__(self, devices: Sequence[str]):
        self.devices = list(devices)
        self.names: list[str] = []
        self.base: list[int] = []
        self.role: list[str] = []
        self.resource: list[int] = []
        self.duration: list[float] = []
        self.outputs: list[list] = []
        self.out_sizes: list[tuple] = []
        self.temp: list[float] = []
        self.persistent: list[float] = []
        self.npreds: list[int] = []
        self.wave: list[int] = []
        self.replica: list[int] = []
        self.shard: list[int] = []
        self.priority: list[float] = []
        self.size: list[float] = []
        self.orders: list[list[int] | None] = [None] * len(self.devices)
        self.memory_tables = None
        self.shared: dict | None = None
        self.derived: dict = {}
        self.mirrors: list[int] = []
        self.replica_home = -1
        self.ring_devices: list[str] = []
        self.gradient_allreduces: dict[int, int] = {}
        self.gathered_allreduces: dict[int, float] = {}

    def __len__(self) -> int:
        return len(self.names)

    @property
    def ring(self) -> int:
        """The resource index of the all-reduce ring."""
        return len(self.devices)

    def used_devices(self) -> set[int]:
        """The indices of the devices some task runs on (the ring's devices with it; the other
        replicas of identical ones as their ``mirrors``).

        Example:
            >>> tasks = TaskGraph(["/GPU:0", "/GPU:1"])
            >>> _ = tasks.add("a", 0, "op", 1, 1e-3, (), 0.0, 0.0, 0.0)
            >>> tasks.used_devices()
            {1}
        """
        count = len(self.devices)
        used = {r for r in self.resource if 0 <= r < count} | set(self.mirrors)
        return used | {self.devices.index(d) for d in self.ring_devices if d in self.devices}

    def add(self, name, base, role, resource, duration, out_sizes, temp, persistent,
            priority, wave=-1, replica=-1, shard=-1, size=0.0) -> int:
        self.size.append(size)
        self.names.append(name)
        self.base.append(base)
        self.role.append(role)
        self.resource.append(resource)
        self.duration.append(duration)
        self.outputs.append([])
        self.out_sizes.append(out_sizes)
        self.temp.append(temp)
        self.persistent.append(persistent)
        self.npreds.append(0)
        self.wave.append(wave)
        self.replica.append(replica)
        self.shard.append(shard)
        self.priority.append(priority)
        return len(self.names) - 1


def queued_tasks(tg: TaskGraph) -> list[bool]:
    """Per task, whether it goes to its device's priority queue: all do, except the tasks a
    device's order lists (auxiliary copies run as soon as they are ready)."""
    queued = [True] * len(tg)
    for order in tg.orders:
        for t in order or ():
            queued[t] = False
    return queued


def build_task_graph(graph: OpGraph, cluster: Cluster, plan: Plan, batch: float | None = None, *,
                     hosted: bool = True) -> TaskGraph:
    """Expands a plan into tasks, validating it on the way.

    Args:
        graph: the step.
        cluster: the devices.
        plan: where and how it runs.
        batch: the batch to price; defaults to the plan's, then the graph's.
        hosted: on a cluster with a host (``Cluster.host``), its host-only ops run there
            (``hostops.on_host``) and the tasks' devices are ``Cluster.hosted``'s; False: on the
            devices alone, as the plan places them (the list schedulers' provisional tasks).

    Raises:
        InvalidPlanError: the plan names unknown ops, layers or devices, breaks a
            colocation group, splits a layer that cannot be split, or orders tasks
            against the data flow.
    """
    with collector_paused():
        return _Builder(graph, cluster, plan, batch, hosted=hosted).build()


def busiest_device_seconds(graph: OpGraph, cluster: Cluster, plan: Plan, batch: float | None = None) -> float:
    """The most seconds of op work any one device of ``plan`` runs, its copies for waves, shards
    and replicas included, summed without building the tasks. A device runs one task at a time
    unless it shares compute, so there no simulation of the plan ends sooner (plus the
    profile's step overhead): a bound to rule a plan out before building and simulating it.

    Raises:
        InvalidPlanError: as ``build_task_graph``.

    Example:
        >>> from kerasflow.planner import Cluster, Plan, synthetic
        >>> graph, cluster = synthetic.chain_mlp(layers=2), Cluster.preset("2xK80-pcie")
        >>> plan = Plan(placement={o.name: "/GPU:1" for o in graph.ops})
        >>> abs(busiest_device_seconds(graph, cluster, plan) - graph.total_work("K80")) < 1e-12
        True
    """
    work = [0.0] * len(cluster.hosted)
    for _, device, seconds in _op_copy_seconds(graph, cluster, plan, batch):
        work[device] += seconds
    return max(work)


def longest_chain_seconds(graph: OpGraph, cluster: Cluster, plan: Plan, batch: float | None = None) -> float:
    """The seconds of op work on the longest chain of dependent ops, each op at its quickest
    copy (waves, shards and replicas included), without building the tasks. Every copy of an
    op waits for a copy of each op it reads, and transfers only add to that wait, so no
    simulation of the plan ends sooner (plus the profile's step overhead): the bound for a plan
    whose devices wait on one another, which ``busiest_device_seconds`` misses.

    Raises:
        InvalidPlanError: as ``build_task_graph``.

    Example:
        >>> from kerasflow.planner import Cluster, Plan, synthetic
        >>> graph, cluster = synthetic.chain_mlp(layers=2), Cluster.preset("2xK80-pcie")
        >>> plan = Plan(placement={o.name: "/GPU:1" for o in graph.ops})
        >>> longest_chain_seconds(graph, cluster, plan) <= busiest_device_seconds(graph, cluster, plan)
        True
    """
    quickest = [float("inf")] * len(graph.ops)
    for i, _, seconds in _op_copy_seconds(graph, cluster, plan, batch):
        if seconds < quickest[i]:
            quickest[i] = seconds
    structure = graph._structure
    done = [0.0] * len(graph.ops)  # per op: when its inputs are done at the earliest, then when it is
    for i in structure.topo:
        finish = done[i] = done[i] + quickest[i]
        for _, consumers in structure.outputs[i]:
            for c in consumers:
                if done[c] < finish:
                    done[c] = finish
    return max(done, default=0.0)


def _op_copy_seconds(graph: OpGraph, cluster: Cluster, plan: Plan, batch: float | None):
    """Every op task ``plan`` builds as ``(op, device, seconds)``, from ``_Builder.op_copies``."""
    builder = _Builder(graph, cluster, plan, batch)
    builder.resolve()
    devices, ops = builder.devices, graph.ops
    # Every op's seconds per device and whole-replica or whole-wave batch, looked up; a shard's
    # share is priced op by op.
    whole = {builder.replica_batch} | {builder.replica_batch * f for f in builder.wave_fraction}
    rows: dict[tuple[int, float], list[float]] = {}
    for _, i, device, batch_share, _, _ in builder.op_copies():
        if batch_share not in whole or device == builder.host:
            yield i, device, builder._duration(ops[i], device, batch_share)
            continue
        row = rows.get((device, batch_share))
        if row is None:
            d = devices[device]
            row = rows[device, batch_share] = durations(graph, d.kind, d.speed, batch_share)
        yield i, device, row[i]


class _Builder:
    def __init__(self, graph: OpGraph, cluster: Cluster, plan: Plan, batch, *, hosted: bool = True):
        # The plan as it runs: the batch and the host-only ops on the host, which joins the
        # devices (hostops).
        self.planned_for = cluster if hosted and host_held_ops(graph) else cluster.unhosted
        self.graph, self.cluster, self.plan = graph, self.planned_for.hosted, on_host(plan, graph, self.planned_for)
        self.batch = float(batch or plan.batch_size or graph.batch_size)
        self.devices = self.cluster.devices
        # The host's index, last: it runs the host-only ops whatever the replica (None: no host).
        self.host = len(self.planned_for) if self.planned_for.host is not None else None
        self.tg = TaskGraph(self.cluster.device_names)
        # Each op's position in topological order (the priority of its tasks), built once per graph.
        self.rank: list[int] = static_tables(graph, self.batch)["priority"]

    # ------------------------------------------------------------------ building
    def resolve(self) -> None:
        """Checks the plan and reads where each op goes, its copies and the replicas."""
        checked = resolve_plan(self.graph, self.planned_for, self.plan)
        self.is_batch, self.place, self.replica_devices = checked.is_batch, checked.place, checked.replica_devices
        self.shards_of_layer, self.whole, self.stage_maps = checked.shards_of_layer, checked.whole, checked.stage_maps
        self.wave_count, self.wave_fraction = checked.wave_count, checked.wave_fraction
        self.dp = self.plan.data_parallel is not None
        self.replicas = self.replica_devices if self.dp else [None]
        self.replica_batch = self.batch / len(self.replicas)
        # Where a data-parallel step's batch is held and cut: each replica's rows are sent from
        # there (``op_copies``). The host, where the cluster has one; else the first replica's
        # device: on logical CPUs the host's CPU is.
        self.batch_holder = self.host if self.host is not None else self.replicas[0]

    def build(self) -> TaskGraph:
        self.resolve()
        self.folded = folded_ops(self.graph)
        plan = self.plan
        simple = plan.data_parallel is None and not plan.splits and self.wave_count == 1
        if simple:
            self._build_simple()
        else:
            self._build_general()
        attach_orders(self.tg, self.cluster, plan)
        return self.tg

    def op_copies(self):
        """Every op task of the plan as ``(replica, op, device, batch, wave, shard)``: replica by
        replica, ops in topological order, a batch op's copies wave by wave and shard by shard
        (wave and shard -1 for an op that runs once per replica, replica -1 without replicas).
        What ``_build_general`` builds and the bounds (``busiest_device_seconds``,
        ``longest_chain_seconds``) read."""
        dp, groups, ops = self.dp, split_groups(self.graph), self.graph.ops
        updates, inputs = batch_statistics(self.graph).updates, batch_inputs(self.graph)
        for r, replica_device in enumerate(self.replicas):
            replica = r if dp else -1
            for i in self.graph._structure.topo:
                home = replica_device if dp else self.place[i]
                if dp and self.host is not None and ops[i].host_only:
                    home = self.host  # each replica's share of them, on the host
                if dp and i in inputs:
                    home = self.batch_holder  # the replica's rows of the batch, sent from there
                if not self.is_batch[i]:
                    yield replica, i, home, self.replica_batch, -1, -1
                    continue
                shards = None if dp or i in self.whole else self.shards_of_layer.get(groups[i])
                if shards and i in updates:
                    shards = shards[:1]  # the shards' one statistic, one moving average to update
                for w in range(self.wave_count):
                    wave_batch = self.replica_batch * self.wave_fraction[w]
                    stage = self.stage_maps[w]
                    for s, (shard_device, fraction) in enumerate(shards or ((home, 1.0),)):
                        device = stage.get(shard_device, shard_device) if stage else shard_device
                        yield replica, i, device, wave_batch * fraction, w, s if shards else -1

    def _duration(self, op, device: int, batch: float) -> float:
        if device == self.host:
            return host_seconds(op, self.devices[0].kind, batch)
        d = self.devices[device]
        return op.duration(d.kind, batch, d.speed)

    def _build_simple(self) -> None:
        """One task per op (no copies): the fast path the split search and big graphs use.

        Everything but the devices and durations is the same for every plan of a graph
        at a batch, so it is built once and shared (the simulator never mutates it).
        """
        graph, tg, batch = self.graph, self.tg, self.batch
        static = static_tables(graph, batch)
        for field in ("names", "base", "role", "outputs", "out_sizes", "temp", "persistent",
                      "npreds", "wave", "replica", "shard", "priority", "size"):
            setattr(tg, field, static[field])
        tg.shared = static
        tg.memory_tables = static["memory_tables"]
        tg.derived = static["derived"]
        place = self.place
        tg.resource = place
        devices = self.devices[:self.host]  # the host (last) runs only its own ops, priced below
        classes = {(d.kind, d.speed) for d in devices}
        if len(classes) == 1:
            kind, speed = next(iter(classes))
            tg.duration = durations(graph, kind, speed, batch)
        else:
            per_class = {c: durations(graph, c[0], c[1], batch) for c in classes}
            rows = [per_class[(d.kind, d.speed)] for d in devices]
            tg.duration = [rows[r][i] if r != self.host else 0.0 for i, r in enumerate(place)]
        if self.host is not None:
            tg.duration = list(tg.duration)  # the graph's shared table stays as it is
            for i in host_held_ops(graph):
                tg.duration[i] = self._duration(graph.ops[i], self.host, batch)

    def _edge(self, p: int, k: int, nbytes: float, c: int, wave: int = -1) -> None:
        """``p``'s output ``k`` (``nbytes``) passed to ``c``: one transfer per output and
        destination device, but one per wave for the reads a wave makes itself (``wave`` >= 0)."""
        tg = self.tg
        if tg.base[p] >= 0 and tg.base[c] >= 0 and self.folded[tg.base[p]] and self.folded[tg.base[c]]:
            nbytes = 0.0  # folded into one constant with its consumer: nothing passes between them
        if wave >= 0:
            key = (p, k, nbytes, wave)
            consumers = self.wave_reads.get(key)
            if consumers is None:
                consumers = self.wave_reads[key] = []
                tg.outputs[p].append((k, nbytes, consumers))
            consumers.append(c)
        else:
            for entry in tg.outputs[p]:
                if entry[0] == k and entry[1] == nbytes:
                    entry[2].append(c)
                    break
            else:
                tg.outputs[p].append((k, nbytes, [c]))
        tg.npreds[c] += 1

    def _build_general(self) -> None:
        graph, tg, plan = self.graph, self.tg, self.plan
        ops = graph.ops
        dp = self.dp
        if dp:
            replicas = self.replicas
            names = [self.cluster.device_names[d] for d in replicas]
            self.ring_link = self.cluster.subset(names).slowest_link() if len(replicas) > 1 else None
            self.ring_size = len(replicas)
            self.ring_nccl = self.cluster.sums_with_nccl(names)
            self.ring_launch = max(self.devices[d].launch_overhead for d in replicas)
            tg.ring_devices = names
            classes = {(self.devices[d].kind, self.devices[d].speed, self.devices[d].memory_bandwidth,
                        self.devices[d].launch_overhead) for d in replicas}
            host_work = self.host is not None and host_ops(graph)
            if len(classes) == 1 and len(replicas) > 1 and not self.cluster.shares_compute(names) and not host_work:
                # Identical replicas run identical timelines: simulate the first one and
                # mirror its figures onto the others (the ring still counts them all). Not
                # where they share compute, nor where the host computes for them: there each
                # replica slows the others (the host's link is each device's own).
                tg.mirrors = replicas[1:]
                tg.replica_home = replicas[0]
                self.replicas = replicas[:1]
                if self.host is None:
                    # The replica simulated stands for every replica: like all but the one holding
                    # the batch, it receives its rows (from a mirror's device, over an identical link).
                    self.batch_holder = replicas[1]
        replicas = self.replicas
        # Per replica: task of each non-batch op, and per batch op per wave a list of
        # (task, batch) per shard.
        single: list[dict[int, int]] = [{} for _ in replicas]
        copies: list[dict[int, list[list[tuple[int, float]]]]] = [{} for _ in replicas]
        self.signature: dict[int, tuple] = {}
        waved, groups = self.wave_count > 1, split_groups(graph)
        for replica, i, device, batch_share, w, s in self.op_copies():
            op, r = ops[i], max(replica, 0)
            if w < 0:
                single[r][i] = tg.add(copy_name(op.name, replica=replica), i, "op", device,
                                      self._duration(op, device, batch_share),
                                      tuple(b.at(batch_share) for b in op.output_bytes),
                                      op.temp_bytes.at(batch_share), float(op.persistent_bytes),
                                      self.rank[i], replica=replica, size=batch_share)
                continue
            per_wave = copies[r].get(i)
            if per_wave is None:
                per_wave = copies[r][i] = [[] for _ in range(self.wave_count)]
                self.signature[i] = (None if dp or i in self.whole else self.shards_of_layer.get(groups[i])) or ()
            name = copy_name(op.name, replica=replica, wave=w if waved else -1, shard=s)
            t = tg.add(name, i, "op", device, self._duration(op, device, batch_share),
                       tuple(x.at(batch_share) for x in op.output_bytes), op.temp_bytes.at(batch_share),
                       0.0, self._wave_priority(i, w), wave=w, replica=replica, shard=s, size=batch_share)
            per_wave[w].append((t, batch_share))
        self.single, self.copies = single, copies
        self.statistics = batch_statistics(graph)
        self.synchronized = dp and plan.synchronizes_statistics
        # A split layer's statistic: each shard's part summed on the first shard's device, the
        # total sent to every shard (forward, a sum over the batch; backward, a gradient's).
        self.shared_statistics = frozenset() if dp else frozenset(
            i for i in self.statistics.reductions if len(self.signature.get(i, ())) > 1)
        self.combines: dict[tuple, int] = {}
        self.wave_reads: dict[tuple, list[int]] = {}
        self.splitters: dict[tuple, int] = {}
        self.allreduces: dict[tuple[int, int], int] = {}
        self.reductions: dict[tuple[int, int], tuple[Affine, list[int]]] = {}
        # An op with one task (one replica and one wave, not split) sends another such op its
        # output as computed: one plain edge, without the general case (but for a variable's
        # handle passed to a batch op, which sends the weights: see ``_connect``).
        one_task = [-1] * len(ops)
        if not dp and self.wave_count == 1:
            for i, t in single[0].items():
                one_task[i] = t
            for i, per_wave in copies[0].items():
                if len(per_wave[0]) == 1:
                    one_task[i] = per_wave[0][0][0]
        is_batch, out_sizes, edge = self.is_batch, tg.out_sizes, self._edge
        for p, outs in enumerate(graph._structure.outputs):
            for k, consumers in outs:
                for c in consumers:
                    src, dst = one_task[p], one_task[c]
                    if src >= 0 and dst >= 0:
                        sent = out_sizes[src][k] if k >= 0 else 0.0
                        if sent or k < 0 or is_batch[p] or not is_batch[c] or not ops[p].persistent_bytes:
                            edge(src, k, sent, dst)
                            continue
                    for r in range(len(replicas)):
                        self._connect(p, k, c, r, dp)
        self._build_allreduces()
        if self.plan.waves is not None and self.plan.waves.offset == "forward" and self.wave_count > 1:
            self._barriers(len(replicas))

    def _connect(self, p: int, k: int, c: int, r: int, dp: bool) -> None:
        ops = self.graph.ops
        out = ops[p].output_bytes[k] if k >= 0 else Affine(0.0, 0.0)
        pb, cb = self.is_batch[p], self.is_batch[c]
        if not pb and not cb:
            self._edge(self.single[r][p], k, out.at(self.batch) if k >= 0 else 0.0, self.single[r][c])
            return
        if not pb:
            src = self.single[r][p]
            sent = self.tg.out_sizes[src][k] if k >= 0 else 0.0
            if k >= 0 and not sent and ops[p].persistent_bytes:
                # A variable's handle passed to a loop that reads it inside: a copy of the loop
                # away from the variable computes with the weights read for it and sent over.
                out, sent = Affine(float(ops[p].persistent_bytes), 0.0), float(ops[p].persistent_bytes)
            waves, resource = self.copies[r][c], self.tg.resource
            if dp and k >= 0 and len(waves) > 1 and out.scales_with_batch and resource[src] != resource[waves[0][0][0]]:
                # A replica's rows of the batch, received once and cut into waves on its
                # device, as the runtime cuts them.
                targets = [target for per_wave in waves for target in per_wave]
                self._one_to_many(src, k, out, sent, targets, (p, k, r, self.signature[c]),
                                  device=resource[targets[0][0]])
                return
            # Each wave runs the model's call again, so it reads a weight (or computes any
            # other value that does not scale with the batch) again, and sends it again to a
            # copy on another device.
            for w, targets in enumerate(waves):
                self._one_to_many(src, k, out, sent, targets, (p, k, r, w, self.signature[c]),
                                  wave=w if self.wave_count > 1 else -1)
            return
        synchronized_reduction = self.synchronized and k >= 0 and p in self.statistics.reductions
        if not cb:
            sources = [task for per_wave in self.copies[r][p] for task in per_wave]
            target = self.single[r][c]
            moving_average = dp and ops[p].phase == "forward" and p in self.statistics.layer_ops
            if dp and k >= 0 and not out.scales_with_batch and (not moving_average or synchronized_reduction):
                # (A layer's statistics reach its moving averages as each replica has them.)
                self._allreduce(p, k, out, target)
            elif dp and k >= 0 and self.ring_size > 1 and ops[p].phase == "backward":
                self._allreduce(p, k, out, target, gather=True)  # a sparse gradient's rows
            else:
                self._many_to_one(sources, k, out, target, (p, k, r))
            return
        if synchronized_reduction:  # the whole batch's statistic, or its gradient: all-reduced
            for target, _ in self.copies[r][c][0]:
                self._allreduce(p, k, out, target)
            return
        for w in range(self.wave_count):
            sources, targets = self.copies[r][p][w], self.copies[r][c][w]
            if k >= 0 and p in self.shared_statistics:
                total = self._many_to_one(sources, k, out, None, (p, k, r, w), resource=self.tg.resource[sources[0][0]])
                self._one_to_many(total, 0, out, self.tg.out_sizes[total][0], targets, (p, k, r, w, self.signature[c]))
                continue
            if self.signature[p] == self.signature[c]:
                for (src, sb), (dst, db) in zip(sources, targets):
                    self._edge(src, k, out.at(sb) if k >= 0 else 0.0, dst)
                continue
            if k < 0:
                for src, _ in sources:
                    for dst, _ in targets:
                        self._edge(src, -1, 0.0, dst)
                continue
            if len(sources) == 1:
                mid, mk, mbytes = sources[0][0], k, out.at(sources[0][1])
            else:
                mid = self._many_to_one(sources, k, out, None, (p, k, r, w),
                                        resource=self.tg.resource[targets[0][0]])
                mk, mbytes = 0, self.tg.out_sizes[mid][0]
            self._one_to_many(mid, mk, out, mbytes, targets, (p, k, r, w, self.signature[c]))

    def _wave_priority(self, op: int, wave: int) -> float:
        """Which copy a device runs first among ready ones (smaller first).

        Tick-Tock (offset "forward"): an earlier wave's tasks go first, so the tick wave's
        backward pass runs as soon as it can and the tock wave fills the idle time. A
        pipeline (offset "none"): topological rank first, then the wave (GPipe: all
        micro-batches' forward passes, then the backward passes).
        """
        if self.wave_count == 1:
            return self.rank[op]
        if self.plan.waves.offset == "forward":
            return wave * len(self.rank) + self.rank[op]
        return self.rank[op] * self.wave_count + wave

    def _one_to_many(self, src, k, out: Affine, src_bytes, targets, key, wave: int = -1,
                     device: int | None = None) -> None:
        """Sends ``src``'s output to each target copy, through a split task when sliced (per
        ``wave`` when it is one wave's read of a value, see ``_edge``), on ``device`` (default:
        ``src``'s)."""
        if k < 0 or len(targets) == 1 or not out.scales_with_batch:
            for dst, db in targets:
                self._edge(src, k, min(src_bytes, out.at(db)) if k >= 0 else 0.0, dst, wave)
            return
        splitter = self.splitters.get(key)
        if splitter is None:
            tg = self.tg
            device = tg.resource[src] if device is None else device
            sizes = tuple(out.at(db) for _, db in targets)
            # The batch cut on the host into rows copies nothing: TensorFlow's slice along the
            # first axis shares its input's buffer (strided_slice_op.cc, "slice is memory
            # contiguous"), and each part crosses the host's link from there.
            aliased = device == self.host and tg.base[src] in batch_inputs(self.graph)
            seconds = 0.0 if aliased else self._copy_seconds(device, src_bytes, sum(sizes))
            splitter = tg.add(auxiliary_name(tg.names[src], k, "split"), -1, "split", device, seconds, sizes, 0.0, 0.0,
                              tg.priority[src], wave=tg.wave[targets[0][0]], replica=tg.replica[src],
                              size=src_bytes + sum(sizes))
            self.splitters[key] = splitter
            self._edge(src, k, src_bytes, splitter)
        for j, (dst, _) in enumerate(targets):
            self._edge(splitter, j, self.tg.out_sizes[splitter][j], dst)

    def _many_to_one(self, sources, k, out: Affine, target, key, resource=None) -> int:
        """Gathers copies into one tensor (concat of activations, sum of gradients)."""
        tg = self.tg
        if len(sources) == 1 or k < 0:
            for src, sb in sources:
                self._edge(src, k, out.at(sb) if k >= 0 else 0.0, target)
            return sources[0][0]
        resource = tg.resource[target] if resource is None else resource
        key = key + (resource,)
        combine = self.combines.get(key)
        if combine is None:
            role = "concat" if out.scales_with_batch else "sum"
            pieces = [out.at(sb) for _, sb in sources]
            size = out.at(sum(sb for _, sb in sources))
            first = sources[0][0]
            # key (op, output, replica, wave, device) is a per-wave gather.
            name = auxiliary_name(self.graph.ops[key[0]].name, k, role, replica=tg.replica[first],
                                  wave=key[3] if len(key) == 5 else -1, device=tg.devices[resource])
            combine = tg.add(name, -1, role, resource,
                             self._copy_seconds(resource, sum(pieces), size), (size,), 0.0, 0.0,
                             tg.priority[first] + 0.5, replica=tg.replica[first], size=sum(pieces) + size)
            self.combines[key] = combine
            for (src, sb), piece in zip(sources, pieces):
                self._edge(src, k, piece, combine)
        if target is not None:
            self._edge(combine, 0, tg.out_sizes[combine][0], target)
        return combine

    def _allreduce(self, p: int, k: int, out: Affine, target: int, gather: bool = False) -> None:
        """The all-reduce of output ``k`` of the batch op ``p`` for ``target``: noted here,
        built by ``_build_allreduces`` once every target is known; with ``gather``, the ring
        passing every replica's rows of a sparse gradient to every other (D - 1 steps of one
        piece per link), built now."""
        if not gather:
            self.reductions.setdefault((p, k), (out, []))[1].append(target)
            return
        tg = self.tg
        ar = self.allreduces.get((p, k))
        if ar is None:
            replicas, link = self.ring_size, self.ring_link
            piece = out.at(self.batch / replicas)
            seconds = 0.0 if link is None else (replicas - 1) * (link.latency + piece / link.bandwidth)
            ar = tg.add(auxiliary_name(self.graph.ops[p].name, k, "allreduce"), -1, "allreduce", tg.ring, seconds,
                        (piece * replicas,), 0.0, 0.0, self.rank[p] + 0.5)
            self.allreduces[(p, k)] = ar
            tg.gathered_allreduces[ar] = piece
            self._reduce_into(p, k, out, [ar] * len(self.copies))
        self._edge(ar, 0, 0.0, target)

    def _build_allreduces(self) -> None:
        """The all-reduces. A weight's gradient (a backward value only updates read) is fused with
        the others of its update round into buffers as the runtime fuses them
        (``ring.fusion_buffers``): a buffer's all-reduce waits for every one of its gradients on
        every replica, and their updates wait for it, so it overlaps only the backward work left
        after its last gradient. Any other value (a loss, a batch statistic, a part of a gradient
        that later ops still combine) is summed alone, priced at its share of one buffer's
        latency, as such small values are packed together."""
        if not self.reductions:
            return
        ops, base = self.graph.ops, self.tg.base
        rounds = self._update_rounds()
        gradients: dict[int, list[tuple[int, int]]] = {}
        others = []
        for key, (out, targets) in self.reductions.items():
            op = ops[key[0]]
            if (op.phase == "backward" and op.type not in _NOT_GRADIENTS
                    and all(ops[base[t]].phase == "update" for t in targets)):
                gradients.setdefault(rounds[key[0]], []).append(key)
            else:
                others.append(key)
        for keys in gradients.values():
            sizes = [self.reductions[key][0].at(self.batch) for key in keys]
            for buffer in fusion_buffers(sizes):
                total = sum(sizes[i] for i in buffer)
                ar = self._ring_task([keys[i] for i in buffer], total, self._ring_seconds(total))
                self.tg.gradient_allreduces[ar] = len(buffer)
        for key in others:
            size = self.reductions[key][0].at(self.batch)
            # A statistic's ring runs alone, on the path of every replica; other small values
            # are packed together.
            share = 1.0 if key[0] in self.statistics.reductions else size / FUSION_BUFFER_BYTES
            self._ring_task([key], size, self._ring_seconds(size, latency_share=share))

    def _update_rounds(self) -> list[int]:
        """Per op, how many optimizer updates run one after another before it. A step with one
        ``apply`` has one round of gradients; a GAN's generator gradients come after the
        discriminator's update. Gradients are fused only within a round: a buffer holding both
        would wait for a gradient that waits for its own update."""
        structure, ops = self.graph._structure, self.graph.ops
        rounds = structure.cache.get("update_rounds")
        if rounds is None:
            rounds = [0] * len(ops)
            for i in structure.topo:
                rounds[i] = max((rounds[p] + (ops[p].phase == "update") for p in structure.preds[i]), default=0)
            structure.cache["update_rounds"] = rounds
        return rounds

    def _ring_task(self, members: list[tuple[int, int]], nbytes: float, seconds: float) -> int:
        """One all-reduce on the ring of the outputs ``members`` (``(op, output)`` pairs), fed by
        every replica's copies of each and feeding each one's targets.

        Each replica copies the buffer in and out on its own device, as
        ``strategies.replicas`` does when there are several members: in, the members
        concatenated into one flat buffer; out, the summed buffer cut back into its members.
        The collective itself takes and gives the flat buffer (a lone member is only reshaped).
        """
        tg = self.tg
        p, k = members[0]
        name, priority = self.graph.ops[p].name, min(self.rank[q] for q, _ in members) + 0.5
        ar = tg.add(auxiliary_name(name, k, "allreduce"), -1, "allreduce", tg.ring, seconds,
                    (nbytes,), 0.0, 0.0, priority)
        packs, unpacks = [], []
        for r in range(len(self.copies)):
            device = tg.resource[self.copies[r][p][0][0][0]]
            seconds_each_way = self._copy_seconds(device, nbytes, nbytes) if len(members) > 1 else 0.0
            packs.append(tg.add(auxiliary_name(name, k, "concat", replica=r), -1, "concat", device,
                                seconds_each_way, (nbytes,), 0.0, 0.0, priority, replica=r, size=nbytes))
            unpacks.append(tg.add(auxiliary_name(name, k, "split", replica=r), -1, "split", device,
                                  seconds_each_way, (nbytes,), 0.0, 0.0, priority, replica=r, size=nbytes))
            self._edge(packs[r], 0, 0.0, ar)
            self._edge(ar, 0, 0.0, unpacks[r])
        for q, j in members:
            out, targets = self.reductions[(q, j)]
            self._reduce_into(q, j, out, packs)
            for target in targets:
                self._edge(unpacks[max(tg.replica[target], 0)], 0, 0.0, target)
        return ar

    def _ring_seconds(self, nbytes: float, latency_share: float = 1.0) -> float:
        """A collective all-reduce of ``nbytes``, priced as the ring algorithm runs it: 2 (D - 1)
        steps, each paying ``latency_share`` of the slowest link's latency and one chunk (1/D of
        the bytes) over it; and its kernels as each implementation runs them (``strategies.
        collectives``): NCCL's whole ring is one kernel, one launch; TensorFlow's ring reducer
        (CPUs, logical GPUs of one card) runs each step's receive and sum as kernels of their own."""
        replicas, link = self.ring_size, self.ring_link
        if link is None:
            return 0.0
        steps = 2 * (replicas - 1)
        launches = 1 if self.ring_nccl else 2 * steps
        return steps * (link.latency * latency_share + nbytes / (replicas * link.bandwidth)) + launches * self.ring_launch

    def _reduce_into(self, p: int, k: int, out: Affine, into: list[int]) -> None:
        """Edges from each replica's copy of output ``k`` of op ``p`` into its task of ``into``
        (the all-reduce itself, or the replica's copy into the buffer)."""
        for r, per_replica in enumerate(self.copies):
            # A replica first sums its waves' gradients locally (gradient accumulation),
            # then the ring reduces one tensor per replica.
            sources = [task for per_wave in per_replica[p] for task in per_wave]
            if len(sources) > 1:
                local = self._many_to_one(sources, k, out, None, (p, k, r),
                                          resource=self.tg.resource[sources[0][0]])
                self._edge(local, 0, 0.0, into[r])
            else:
                self._edge(sources[0][0], k, 0.0, into[r])

    def _copy_seconds(self, resource: int, read: float, write: float) -> float:
        return self.devices[resource].copy_seconds(read, write)

    def _barriers(self, replicas: int) -> None:
        tg, ops = self.tg, self.graph.ops
        # Only the pure forward pass takes part: forward ops downstream of a backward op that
        # reads the batch or of a gather of all waves (a loss tracker, an RNN state read after
        # the update) would make the barrier wait on the next wave itself. A backward op that
        # reads nothing of the batch (a loop's gradient accumulators, made from shapes alone
        # for the forward loop to fill) runs before the forward pass ends: the loop it feeds is
        # in the pass, behind the barrier, as the runtime's wave runs it.
        structure = self.graph._structure
        tainted = [False] * len(ops)
        reads_batch = [False] * len(ops)
        for i in structure.topo:
            preds = structure.preds[i]
            reads_batch[i] = any(reads_batch[p] for p in preds) or (
                not preds and any(b.scales_with_batch for b in ops[i].output_bytes))
            inherited = any(tainted[p] or (not self.is_batch[i] and self.is_batch[p]) for p in preds)
            tainted[i] = inherited or (self.is_batch[i] and ops[i].phase != "forward" and reads_batch[i])
        forward = [i for i in self.copies[0] if ops[i].phase == "forward" and not tainted[i]]
        for r in range(replicas):
            for w in range(1, self.wave_count):
                barrier = tg.add(barrier_name(r, w), -1, "barrier", -1, 0.0, (), 0.0, 0.0, -1.0,
                                 wave=w, replica=r)
                for i in forward:
                    for src, _ in self.copies[r][i][w - 1]:
                        self._edge(src, -1, 0.0, barrier)
                    for dst, _ in self.copies[r][i][w]:
                        self._edge(barrier, -1, 0.0, dst)
