"""Expands (graph, cluster, plan) into the concrete tasks of one step: what the simulator runs.

A plan's splits, waves and replicas turn one op into several copies, and add the work
they cost: ``split`` copies of a tensor into shards, ``concat``/``sum`` of shard outputs
(activations are concatenated, gradients summed), a ring ``allreduce`` per gradient for
data parallelism, and a ``barrier`` that holds a wave's forward pass until the previous
wave's forward pass is done. Everything here is plain lists indexed by task id, because
the simulator's inner loop reads them millions of times.
"""

from __future__ import annotations

from typing import Sequence

from .cluster import Cluster
from .errors import InvalidPlanError
from .graph import Affine, OpGraph
from .plan import Plan

__all__ = ["TaskGraph", "build_task_graph", "batch_ops", "AUXILIARY_ROLES"]

# All-reduce libraries fuse gradients into buffers before reducing them (Horovod's tensor
# fusion: 64 MiB; PyTorch DDP's buckets: 25 MiB; tf.distribute's NCCL all-reduce packs the
# gradients), so the ring's per-step latency is paid per buffer, not per gradient tensor.
# Charging it per tensor made data parallelism on a high-latency network (two hosts over
# Ethernet) many times slower than measured systems are; 25 MiB is the smaller common size.
FUSION_BUFFER_BYTES = 25 * 2**20

AUXILIARY_ROLES = ("split", "concat", "sum", "allreduce", "barrier")
_BATCH_PHASES = ("forward", "backward")


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
        devices: the cluster's device names; ``ring_bytes``/``ring_seconds`` describe the
            all-reduce figures used.
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
        # numpy tables the simulator's memory pass builds once; ``shared`` is the
        # per-graph cache they are stored in when the tasks are the graph's own ops.
        self.memory_tables = None
        self.shared: dict | None = None
        # Data parallelism over identical devices simulates replica 0 only; these are the
        # other replicas' devices, whose figures mirror replica 0's.
        self.mirrors: list[int] = []
        self.replica_home = -1

    def __len__(self) -> int:
        return len(self.names)

    @property
    def ring(self) -> int:
        """The resource index of the all-reduce ring."""
        return len(self.devices)

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


def batch_ops(graph: OpGraph) -> list[bool]:
    """Which ops run once per sample slice (copied per wave, shard and replica).

    Forward and backward ops are, except those colocated with a variable (reads of the
    weights): they run once and send the weights to every copy.
    """
    cached = graph._structure.cache.get("batch_ops")
    if cached is None:
        anchored = {op.colocation for op in graph.ops if op.persistent_bytes and op.colocation}
        cached = [
            op.phase in _BATCH_PHASES and not op.persistent_bytes and op.colocation not in anchored
            for op in graph.ops
        ]
        graph._structure.cache["batch_ops"] = cached
    return cached


def _colocation_groups(graph: OpGraph) -> list[tuple[str, list[int]]]:
    """(group, op indices) for every colocation group of more than one op."""
    cached = graph._structure.cache.get("colocation")
    if cached is None:
        groups: dict[str, list[int]] = {}
        for i, op in enumerate(graph.ops):
            if op.colocation is not None:
                groups.setdefault(op.colocation, []).append(i)
        cached = [(g, m) for g, m in groups.items() if len(m) > 1]
        graph._structure.cache["colocation"] = cached
    return cached


def build_task_graph(graph: OpGraph, cluster: Cluster, plan: Plan, batch: float | None = None) -> TaskGraph:
    """Expands a plan into tasks, validating it on the way.

    Args:
        graph: the step.
        cluster: the devices.
        plan: where and how it runs.
        batch: the batch to price; defaults to the plan's, then the graph's.

    Raises:
        InvalidPlanError: the plan names unknown ops, layers or devices, breaks a
            colocation group, splits a layer that cannot be split, or orders tasks
            against the data flow.
    """
    return _Builder(graph, cluster, plan, batch).build()


class _Builder:
    def __init__(self, graph: OpGraph, cluster: Cluster, plan: Plan, batch):
        self.graph, self.cluster, self.plan = graph, cluster, plan
        self.batch = float(batch or plan.batch_size or graph.batch_size)
        self.dev_index = {name: i for i, name in enumerate(cluster.device_names)}
        self.devices = cluster.devices
        self.tg = TaskGraph(cluster.device_names)

    @property
    def rank(self) -> list[int]:
        """Each op's position in topological order (the priority of its tasks), built once per graph."""
        return _static_tables(self.graph, self.batch)["priority"]

    # ------------------------------------------------------------------ checks
    def _device(self, name: str, what: str) -> int:
        index = self.dev_index.get(name)
        if index is None:
            raise InvalidPlanError(
                f"{what} names device {name!r}, which is not in cluster {self.cluster.name!r} "
                f"(devices: {self.cluster.device_names}). Replan for this cluster or fix the device.")
        return index

    def _check(self) -> None:
        graph, plan = self.graph, self.plan
        ops = graph.ops
        self.is_batch = batch_ops(graph)
        if plan.data_parallel is None:
            placement = plan.placement
            dev_index = self.dev_index
            try:
                self.place = [dev_index[placement[op.name]] for op in ops]
            except KeyError:
                self.place = [self._placed(op.name) for op in ops]
            if len(placement) != len(ops):
                unknown = [name for name in placement if name not in graph]
                raise InvalidPlanError(
                    f"The plan places {len(unknown)} op(s) the graph does not have, e.g. "
                    f"{unknown[:3]}; it was made for another graph (fingerprint "
                    f"{plan.graph_fingerprint or 'unknown'}, graph's {graph.fingerprint()}). Replan.")
            place = self.place
            for group, members in _colocation_groups(graph):
                device = place[members[0]]
                for i in members:
                    if place[i] != device:
                        raise InvalidPlanError(
                            f"colocation group {group!r} is split: op {ops[members[0]].name!r} is on "
                            f"{placement[ops[members[0]].name]!r} but op {ops[i].name!r} is on "
                            f"{placement[ops[i].name]!r}. A variable, its reads and its updates must "
                            "share one device.")
        else:
            self.replica_devices = [self._device(d, "data_parallel") for d in plan.data_parallel.devices]
        layers = graph.layers() if plan.splits else {}
        self.shards_of_layer: dict[str, tuple[tuple[int, float], ...]] = {}
        for layer, shards in plan.splits.items():
            if layer not in layers:
                raise InvalidPlanError(
                    f"The plan splits layer {layer!r}, which the graph does not have "
                    f"(layers: {sorted(layers)[:8]}...). Replan for this graph.")
            for name in layers[layer]:
                op = graph.op(name)
                if self.is_batch[graph.index(name)] and not op.splittable:
                    raise InvalidPlanError(
                        f"layer {layer!r} cannot be split: its op {name!r}"
                        f"{f' ({op.type})' if op.type else ''} has no batch "
                        "axis (it couples the samples of a batch). Remove the split.")
            self.shards_of_layer[layer] = tuple(
                (self._device(s.device, f"split of layer {layer!r}"), s.fraction) for s in shards)
        waves = plan.waves
        self.wave_count = waves.count if waves is not None else 1
        self.wave_fraction = [waves.fraction(w) if waves else 1.0 for w in range(self.wave_count)]
        self.stage_maps: list[dict[int, int] | None] = []
        for w in range(self.wave_count):
            if waves is None or not waves.stage_maps or not waves.stage_maps[w]:
                self.stage_maps.append(None)
                continue
            self.stage_maps.append({
                self._device(a, f"waves.stage_maps[{w}]"): self._device(b, f"waves.stage_maps[{w}]")
                for a, b in waves.stage_maps[w].items()})

    def _placed(self, name: str) -> int:
        device = self.plan.placement.get(name)
        if device is None:
            raise InvalidPlanError(
                f"op {name!r} has no device in the plan's placement; every op needs one. "
                "Replan for this graph.")
        return self._device(device, f"placement of op {name!r}")

    # ------------------------------------------------------------------ building
    def build(self) -> TaskGraph:
        self._check()
        plan = self.plan
        simple = plan.data_parallel is None and not plan.splits and self.wave_count == 1
        if simple:
            self._build_simple()
        else:
            self._build_general()
        self._apply_orders()
        return self.tg

    def _duration(self, op, device: int, batch: float) -> float:
        d = self.devices[device]
        return op.duration(d.kind, batch, d.speed)

    def _build_simple(self) -> None:
        """One task per op (no copies): the fast path the split search and big graphs use.

        Everything but the devices and durations is the same for every plan of a graph
        at a batch, so it is built once and shared (the simulator never mutates it).
        """
        graph, tg, batch = self.graph, self.tg, self.batch
        static = _static_tables(graph, batch)
        for field in ("names", "base", "role", "outputs", "out_sizes", "temp", "persistent",
                      "npreds", "wave", "replica", "shard", "priority", "size"):
            setattr(tg, field, static[field])
        tg.shared = static
        tg.memory_tables = static["memory_tables"]
        place = self.place
        tg.resource = place
        devices = self.devices
        classes = {(d.kind, d.speed) for d in devices}
        if len(classes) == 1:
            kind, speed = next(iter(classes))
            tg.duration = _durations(graph, kind, speed, batch)
        else:
            per_class = {c: _durations(graph, c[0], c[1], batch) for c in classes}
            rows = [per_class[(d.kind, d.speed)] for d in devices]
            tg.duration = [rows[r][i] for i, r in enumerate(place)]

    def _edge(self, p: int, k: int, nbytes: float, c: int) -> None:
        tg = self.tg
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
        dp = plan.data_parallel is not None
        replicas = self.replica_devices if dp else [None]
        replica_batch = self.batch / len(replicas)
        if dp:
            names = [self.cluster.device_names[d] for d in replicas]
            self.ring_link = self.cluster.subset(names).slowest_link() if len(replicas) > 1 else None
            self.ring_size = len(replicas)
            classes = {(self.devices[d].kind, self.devices[d].speed, self.devices[d].memory_bandwidth,
                        self.devices[d].launch_overhead) for d in replicas}
            if len(classes) == 1 and len(replicas) > 1:
                # Identical replicas run identical timelines: simulate the first one and
                # mirror its figures onto the others (the ring still counts them all).
                tg.mirrors = replicas[1:]
                tg.replica_home = replicas[0]
                replicas = replicas[:1]
        # Per replica: task of each non-batch op, and per batch op per wave a list of
        # (task, batch) per shard.
        single: list[dict[int, int]] = []
        copies: list[dict[int, list[list[tuple[int, float]]]]] = []
        self.signature: dict[int, tuple] = {}
        order = graph._structure.topo
        for r, rdev in enumerate(replicas):
            single.append({})
            copies.append({})
            rsuffix = f"@r{r}" if dp else ""
            for i in order:
                op = ops[i]
                home = rdev if dp else self.place[i]
                if not self.is_batch[i]:
                    t = tg.add(op.name + rsuffix, i, "op", home, self._duration(op, home, replica_batch),
                               tuple(b.at(replica_batch) for b in op.output_bytes),
                               op.temp_bytes.at(replica_batch), float(op.persistent_bytes),
                               self.rank[i], replica=r if dp else -1, size=replica_batch)
                    single[r][i] = t
                    continue
                shards = None if dp else self.shards_of_layer.get(op.layer)
                self.signature[i] = shards or ()
                per_wave = []
                for w in range(self.wave_count):
                    wbatch = replica_batch * self.wave_fraction[w]
                    wsuffix = f"@w{w}" if self.wave_count > 1 else ""
                    stage = self.stage_maps[w]
                    tasks = []
                    for s, (sdev, frac) in enumerate(shards or ((home, 1.0),)):
                        device = stage.get(sdev, sdev) if stage else sdev
                        b = wbatch * frac
                        name = op.name + rsuffix + wsuffix + (f"@s{s}" if shards else "")
                        t = tg.add(name, i, "op", device, self._duration(op, device, b),
                                   tuple(x.at(b) for x in op.output_bytes), op.temp_bytes.at(b),
                                   0.0, self._wave_priority(i, w), wave=w, replica=r if dp else -1,
                                   shard=s if shards else -1, size=b)
                        tasks.append((t, b))
                    per_wave.append(tasks)
                copies[r][i] = per_wave
        self.single, self.copies = single, copies
        self.combines: dict[tuple, int] = {}
        self.splitters: dict[tuple, int] = {}
        self.allreduces: dict[tuple[int, int], int] = {}
        for p, outs in enumerate(graph._structure.outputs):
            for k, consumers in outs:
                for c in consumers:
                    for r in range(len(replicas)):
                        self._connect(p, k, c, r, dp)
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
            for w, targets in enumerate(self.copies[r][c]):
                self._one_to_many(src, k, out, self.tg.out_sizes[src][k] if k >= 0 else 0.0,
                                  targets, (p, k, r, w, self.signature[c]))
            return
        if not cb:
            sources = [task for per_wave in self.copies[r][p] for task in per_wave]
            target = self.single[r][c]
            if dp and k >= 0 and not out.scales_with_batch:
                self._allreduce(p, k, out, target)
            else:
                self._many_to_one(sources, k, out, target, (p, k, r))
            return
        for w in range(self.wave_count):
            sources, targets = self.copies[r][p][w], self.copies[r][c][w]
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

    def _one_to_many(self, src, k, out: Affine, src_bytes, targets, key) -> None:
        """Sends ``src``'s output to each target copy, through a split task when sliced."""
        if k < 0 or len(targets) == 1 or not out.scales_with_batch:
            for dst, db in targets:
                self._edge(src, k, min(src_bytes, out.at(db)) if k >= 0 else 0.0, dst)
            return
        splitter = self.splitters.get(key)
        if splitter is None:
            tg = self.tg
            device = tg.resource[src]
            sizes = tuple(out.at(db) for _, db in targets)
            splitter = tg.add(f"{tg.names[src]}:{k}@split", -1, "split", device,
                              self._copy_seconds(device, src_bytes, sum(sizes)), sizes, 0.0, 0.0,
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
            name = f"{self.graph.ops[key[0]].name}:{k}@{role}"
            if tg.replica[first] >= 0:
                name += f"@r{tg.replica[first]}"
            if len(key) == 5:  # (op, output, replica, wave, device): a per-wave gather
                name += f"@w{key[3]}"
            name += f"@{tg.devices[resource]}"
            combine = tg.add(name, -1, role, resource,
                             self._copy_seconds(resource, sum(pieces), size), (size,), 0.0, 0.0,
                             tg.priority[first] + 0.5, replica=tg.replica[first], size=sum(pieces) + size)
            self.combines[key] = combine
            for (src, sb), piece in zip(sources, pieces):
                self._edge(src, k, piece, combine)
        if target is not None:
            self._edge(combine, 0, tg.out_sizes[combine][0], target)
        return combine

    def _allreduce(self, p: int, k: int, out: Affine, target: int) -> None:
        tg = self.tg
        ar = self.allreduces.get((p, k))
        if ar is None:
            gradient = out.at(self.batch)
            replicas, link = self.ring_size, self.ring_link
            # Each of the ring's 2(D-1) steps pays the link's latency once per fused buffer
            # (see FUSION_BUFFER_BYTES): a gradient pays its share of that buffer's latency.
            seconds = 0.0 if link is None else 2 * (replicas - 1) * (
                link.latency * gradient / FUSION_BUFFER_BYTES + gradient / (replicas * link.bandwidth))
            ar = tg.add(f"{self.graph.ops[p].name}:{k}@allreduce", -1, "allreduce", tg.ring, seconds,
                        (gradient,), 0.0, 0.0, self.rank[p] + 0.5)
            self.allreduces[(p, k)] = ar
            for r, per_replica in enumerate(self.copies):
                # A replica first sums its waves' gradients locally (gradient accumulation),
                # then the ring reduces one tensor per replica.
                sources = [task for per_wave in per_replica[p] for task in per_wave]
                if len(sources) > 1:
                    local = self._many_to_one(sources, k, out, None, (p, k, r),
                                              resource=self.tg.resource[sources[0][0]])
                    self._edge(local, 0, 0.0, ar)
                else:
                    self._edge(sources[0][0], k, 0.0, ar)
        self._edge(ar, 0, 0.0, target)

    def _copy_seconds(self, resource: int, read: float, write: float) -> float:
        d = self.devices[resource]
        return d.launch_overhead + (read + write) / d.memory_bandwidth

    def _barriers(self, replicas: int) -> None:
        tg, ops = self.tg, self.graph.ops
        # Only the pure forward pass takes part: forward ops downstream of a backward op or of
        # a gather of all waves (a loss tracker, an RNN state read after the update) would make
        # the barrier wait on the next wave itself.
        structure = self.graph._structure
        tainted = [False] * len(ops)
        for i in structure.topo:
            inherited = any(tainted[p] or (not self.is_batch[i] and self.is_batch[p]) for p in structure.preds[i])
            tainted[i] = inherited or (self.is_batch[i] and ops[i].phase != "forward")
        forward = [i for i in self.copies[0] if ops[i].phase == "forward" and not tainted[i]]
        for r in range(replicas):
            for w in range(1, self.wave_count):
                barrier = tg.add(f"@barrier@r{r}@w{w}", -1, "barrier", -1, 0.0, (), 0.0, 0.0, -1.0,
                                 wave=w, replica=r)
                for i in forward:
                    for src, _ in self.copies[r][i][w - 1]:
                        self._edge(src, -1, 0.0, barrier)
                    for dst, _ in self.copies[r][i][w]:
                        self._edge(barrier, -1, 0.0, dst)

    # ------------------------------------------------------------------ orders
    def _apply_orders(self) -> None:
        order = self.plan.order
        if not order:
            return
        tg = self.tg
        ids = {name: t for t, name in enumerate(tg.names) if tg.role[t] == "op"}
        for device, names in order.items():
            d = self._device(device, "order")
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
            expected = [t for t in range(len(tg)) if tg.resource[t] == d and tg.role[t] == "op"]
            if len(set(seen)) != len(seen) or sorted(seen) != expected:
                missing = sorted(set(expected) - set(seen))
                detail = (f"it misses {[tg.names[t] for t in missing[:3]]}" if missing
                          else "it lists a task twice")
                raise InvalidPlanError(
                    f"order[{device!r}] must list each of the device's {len(expected)} tasks once; "
                    f"{detail}. Replan, or drop the order to run by priority.")
            tg.orders[d] = seen
        self._check_orders_acyclic()

    def _check_orders_acyclic(self) -> None:
        tg = self.tg
        n = len(tg)
        missing = list(tg.npreds)
        next_in_order = [-1] * n
        for seq in tg.orders:
            if seq:
                for a, b in zip(seq, seq[1:]):
                    next_in_order[a] = b
                    missing[b] += 1
        stack = [t for t in range(n) if missing[t] == 0]
        done = 0
        while stack:
            t = stack.pop()
            done += 1
            for _, _, consumers in tg.outputs[t]:
                for c in consumers:
                    missing[c] -= 1
                    if missing[c] == 0:
                        stack.append(c)
            b = next_in_order[t]
            if b >= 0:
                missing[b] -= 1
                if missing[b] == 0:
                    stack.append(b)
        if done == n:
            return
        stuck = {t for t in range(n) if missing[t] > 0}
        for d, seq in enumerate(tg.orders):
            if not seq:
                continue
            for position, t in enumerate(seq):
                if t in stuck:
                    later = set(seq[position + 1:])
                    blocker = self._blocking_predecessor(t, later)
                    reason = (f"it depends on {tg.names[blocker]!r}, which comes later in that order"
                              if blocker is not None else "it waits on a task that waits on this order")
                    raise InvalidPlanError(
                        f"order[{tg.devices[d]!r}] runs {tg.names[t]!r} too early: {reason}. "
                        "Orders must respect the data flow; replan or fix the order.")
        raise InvalidPlanError("The plan's orders contradict the data flow; replan.")

    def _blocking_predecessor(self, task: int, later: set[int]) -> int | None:
        """A task in ``later`` that ``task`` depends on, searching backwards (BFS)."""
        tg = self.tg
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


def _static_tables(graph: OpGraph, batch: float) -> dict:
    key = ("static", batch)
    cached = graph._structure.cache.get(key)
    if cached is not None:
        return cached
    ops = graph.ops
    s = graph._structure
    n = len(ops)
    out_sizes = [tuple(b.fixed + b.per_sample * batch for b in op.output_bytes) for op in ops]
    outputs = [[(k, out_sizes[i][k] if k >= 0 else 0.0, consumers) for k, consumers in s.outputs[i]]
               for i in range(n)]
    rank = [0] * n
    for position, i in enumerate(s.topo):
        rank[i] = position
    minus = [-1] * n
    table = {
        "names": [op.name for op in ops],
        "base": list(range(n)),
        "role": ["op"] * n,
        "outputs": outputs,
        "out_sizes": out_sizes,
        "temp": [op.temp_bytes.fixed + op.temp_bytes.per_sample * batch for op in ops],
        "persistent": [float(op.persistent_bytes) for op in ops],
        "npreds": [len(p) for p in s.preds],
        "wave": minus, "replica": minus, "shard": minus,
        "priority": rank,
        "size": [float(batch)] * n,
        "memory_tables": None,
    }
    graph._structure.cache[key] = table
    return table


def _durations(graph: OpGraph, kind: str, speed: float, batch: float) -> list[float]:
    key = ("durations", kind, speed, batch)
    cached = graph._structure.cache.get(key)
    if cached is None:
        cached = [op.duration(kind, batch, speed) for op in graph.ops]
        graph._structure.cache[key] = cached
    return cached
