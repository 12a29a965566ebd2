"""Applies a ``Plan`` to the ops of a traced training step: devices, and each device's order.

Called at trace time, right after the step's ops were created (on every trace, retraces
included). An op's device comes from the plan by name; ops the plan does not know (a
relaxed-shape retrace adds some) are placed by their layer's device, found from their name
scope; copies made by splits (``.../shard<i>/...``) and waves (``wave<w>/...``) take their
shard's device and their wave's stage map; a data-parallel replica's (``replica<r>/...``) its
replica's device. A sum of gradients the tape made (``AddN``, numbered by position) is known by
the ops that read it: the profiled sum with the same readers, in their shard. Ops that take a variable run where the variable lives. A split layer's
shards are cut where their input is made and joined where the joined tensor is used, as the
simulator's split and concat tasks run. An op left without a device
whose consumers share one runs there (the sum of a split layer's weight gradients, created by
autodiff, runs where the update does, as simulated).
Each device's order is enforced with control edges, unless that would close a
cycle (then the order is skipped, and ``placement_report()`` says so); ops Grappler folds into
constants are left out of it. A planned op is found in the trace by identity: its name (with
its copy's wave and shard) and its type; a planned op that runs a kernel and is not in the
trace, or is there as an op of another type (TensorFlow numbers same-named ops by position,
so an extra op shifts the numbers), is left out of the order and named by ``placement_report()``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import tensorflow as tf

from kerasflow.devices import normalize_device
from kerasflow.planner.ir.costmodel import METADATA_OP_TYPES
from kerasflow.planner.ir.graph import OpGraph
from kerasflow.planner.ir.graphtables import (WEIGHT_READING_LOOPS, batch_ops, batch_statistics, fused_ops,
                                           gradient_sum_readers, split_groups, weight_bound_layers)
from kerasflow.planner.ir.plan import Plan
from kerasflow.planner.sim.tasknames import parse_copy_name
from kerasflow.planner.ir.toposort import topological_order
from kerasflow.strategies.scopes import replica_of, shard_boundary, split_name

__all__ = ["PlanApplier", "ApplyReport"]


@dataclass
class ApplyReport:
    """What one application of the plan did at trace time."""

    placed: int = 0
    by_layer: int = 0
    unplaced: list[str] = field(default_factory=list)
    ordered_edges: int = 0
    order_skipped: str = ""
    order_missing: list[str] = field(default_factory=list)  # planned ops that run a kernel, not in the trace


class PlanApplier:
    """Places and orders the ops of a traced step according to ``plan``.

    Args:
        plan: the plan.
        graph: the profiled ``OpGraph`` the plan was made for (its op names and layers).
        devices: the devices of the cluster, in order (the first is the fallback).
    """

    def __init__(self, plan: Plan, graph: OpGraph | None, devices: list[str]):
        self._plan = plan  # its own reading only: the plan in force is read from the driver's ``InForce``
        self.devices = list(devices)
        self.layer_of: dict[str, str] = {}
        self.scope_layer: dict[str, str | None] = {}
        self.op_type = {op.name: op.type for op in graph.ops if op.type} if graph is not None else {}
        self.weight_bound_layers = weight_bound_layers(graph) if graph is not None else set()
        # Ops the plan runs once however the batch is cut (a BatchNormalization's update of its
        # moving statistics, which its first shard makes inside its scope).
        self.runs_once = {op.name for op, copied in zip(graph.ops, batch_ops(graph)) if not copied
                          } if graph is not None else set()
        self.loops = [(op.name, op.name.split("/")) for op in graph.ops
                      if op.type in WEIGHT_READING_LOOPS] if graph is not None else []
        self.fused = fused_ops(graph) if graph is not None else frozenset()
        self.unordered = self.fused | _summed_statistics_gradients(graph, plan)
        if graph is not None:
            # An op's split group: its layer, the compiled loss' pseudo-layer, a gradient sum's layer.
            for op, layer in zip(graph.ops, split_groups(graph)):
                if layer is None:
                    continue
                self.layer_of[op.name] = layer
                parts = op.name.split("/")
                for i in range(1, len(parts)):
                    scope = "/".join(parts[:i])
                    self.scope_layer[scope] = layer if self.scope_layer.get(scope, layer) == layer else None
        votes: dict[str, dict[str, int]] = {}
        for name, device in plan.placement.items():
            layer = self.layer_of.get(name)
            if layer is not None:
                votes.setdefault(layer, {}).setdefault(device, 0)
                votes[layer][device] += 1
        self.layer_device = {layer: max(v, key=lambda d: (v[d], d)) for layer, v in votes.items()}
        for layer, shards in plan.splits.items():
            self.layer_device.setdefault(layer, shards[0].device)
        # The names of the ops that read each of the tape's sums of gradients -> the sum's name.
        sums = gradient_sum_readers(graph) if graph is not None else {}
        self.sum_of_readers = {readers: name for name, readers in sums.items()}
        # Per layer, its one sum of its input's gradient (read by other layers only), if it has one.
        input_sums: dict[str, list[str]] = {}
        for name, readers in sums.items():
            layer = self.layer_of.get(name)
            if layer is not None and all(self.layer_of.get(reader) != layer for reader in readers):
                input_sums.setdefault(layer, []).append(name)
        self.input_gradient_sum = {layer: names[0] for layer, names in input_sums.items() if len(names) == 1}
        self.traced_copies: dict[str, tuple[str, int, int]] = {}  # the last trace's sums: name -> copy
        self.traced_types: dict[str, str] = {}  # the last trace's ops: name -> type
        self.last_report = ApplyReport()
        self.tensor_bytes: dict[str, float | None] = {}  # "<op>:<i>" -> bytes, from the last trace
        self.skip_order = False  # set when TensorFlow refused the ordered step
        self.order_refused = ""  # TensorFlow's reason, when it did

    def refuse_order(self, reason: str) -> None:
        """Traces without the per-device order from now on, remembering why."""
        self.skip_order = True
        self.order_refused = reason

    def not_applied(self) -> list[str]:
        """The parts of the plan the last trace did not apply, each with its reason."""
        report, parts = self.last_report, []
        if self.order_refused:
            parts.append(f"the per-device order (TensorFlow could not run it: {self.order_refused})")
        elif report.order_skipped:
            parts.append(f"the per-device order ({report.order_skipped})")
        elif report.order_missing:
            parts.append(f"the per-device order of {len(report.order_missing)} planned ops this trace does not "
                         f"have as planned ({_first_three(report.order_missing)}); they run in data-flow order")
        if report.unplaced:
            parts.append(f"devices for {len(report.unplaced)} ops the plan does not name, placed by TensorFlow "
                         f"({_first_three(report.unplaced)})")
        return parts

    def layer_of_name(self, base: str) -> str | None:
        """The layer of an op name (exact, else its longest known scope)."""
        layer = self.layer_of.get(base)
        if layer is not None:
            return layer
        parts = base.split("/")
        if parts and parts[0] == "gradient_tape":
            parts = parts[1:]
        for i in range(len(parts), 0, -1):
            layer = self.scope_layer.get("/".join(parts[:i]))
            if layer:
                return layer
        return None

    def is_planned_op(self, base: str, op_type: str | None) -> bool:
        """Whether the traced op named ``base`` (of ``op_type``, None: unknown) is the planned op
        of that name: the profile has none of another type (an op without a type matches by name)."""
        return op_type is None or self.op_type.get(base, op_type) == op_type

    def device_for(self, name: str, op_type: str | None = None) -> tuple[str | None, bool]:
        """The planned device of op ``name`` (of ``op_type`` when known), and whether it came
        from the layer fallback (also taken for a same-named op of another type)."""
        plan = self._plan
        if plan.data_parallel is not None:
            replica = replica_of(name)
            return (plan.data_parallel.devices[replica] if 0 <= replica < len(plan.data_parallel.devices)
                    else None), False
        return self._device_of_copy(*self.copy_of(name), op_type)

    def copy_of(self, name: str) -> tuple[str, int, int]:
        """The profiled op a traced op is a copy of, with its wave and shard (-1 when none): its
        name without those scopes (``split_name``); for a sum of gradients the tape made, the
        profiled sum read by the same ops (found at the last trace: TensorFlow numbers those sums
        by position, and a split layer's shards add some)."""
        return self.traced_copies.get(name) or split_name(name)

    def _find_sum(self, op: tf.Operation, live: dict[str, tf.Operation]) -> None:
        """Records which profiled sum of gradients ``op`` is a copy of, if it is one: a sum
        outside every scope whose live readers are one copy (wave and shard) of the readers of
        a profiled sum."""
        if op.type != "AddN" or "/" in split_name(op.name)[0] or not self.sum_of_readers:
            return
        consumers = [c.name for t in op.outputs for c in t.consumers() if c.name in live]
        readers = [split_name(name) for name in consumers]
        copies = {(w, s) for _, w, s in readers}
        profiled = self.sum_of_readers.get(frozenset(name for name, _, _ in readers))
        if profiled is None and consumers and all(shard_boundary(name) for name in consumers):
            # A shard of a split layer sums the gradient of its piece of the layer's input, which
            # the cut's gradient joins: the layer's sum of its input's gradient, per shard.
            layers = {self.layer_of_name(name) for name, _, _ in readers}
            copies = {split_name(t.op.name)[1:] for t in op.inputs}
            profiled = self.input_gradient_sum.get(layers.pop()) if len(layers) == 1 else None
        if profiled is not None and len(copies) == 1:
            self.traced_copies[op.name] = (profiled, *copies.pop())

    def device_inside_loop(self, name: str) -> str | None:
        """The planned device of an op inside a loop's body (``name`` as traced, which the
        profile does not have): the device of the profiled loop whose name shares the most
        scopes with it (a loop's body ops, and its gradient loop's, are named under its
        scope), for the op's wave and shard; else the device of the op's layer."""
        base, wave, shard = split_name(name)
        parts = base.split("/")
        best, shared = None, 1
        for loop, scopes in self.loops:
            common = len(os.path.commonprefix([parts, scopes]))
            if common > shared:
                best, shared = loop, common
        return self._device_of_copy(best if best is not None else base, wave, shard, None)[0]

    def _device_of_copy(self, base: str, wave: int, shard: int, op_type: str | None) -> tuple[str | None, bool]:
        plan = self._plan
        named = base in plan.placement and self.is_planned_op(base, op_type)
        device = None
        by_layer = False
        layer = self.layer_of_name(base) if (shard >= 0 or not named) else None
        if shard >= 0 and layer in plan.splits and shard < len(plan.splits[layer]):
            device = plan.splits[layer][shard].device
        elif named:
            device = plan.placement[base]
        elif layer is not None and layer in self.layer_device:
            device, by_layer = self.layer_device[layer], True
        if device is not None and wave >= 0 and plan.waves is not None and wave < plan.waves.count:
            device = plan.waves.device(wave, device)
        return device, by_layer

    def apply(self, ops: list[tf.Operation], captures: dict[str, str]) -> ApplyReport:
        """Places ``ops`` (created by one trace of the step) and orders them.

        Args:
            ops: the step's new ops.
            captures: internal placeholder name -> device of the captured variable.
        """
        report = ApplyReport()
        by_name = {op.name: op for op in ops}
        self.traced_types = {op.name: op.type for op in ops}
        self.traced_copies = {}
        for op in ops:
            self._find_sum(op, by_name)
        colocated = []
        for op in ops:
            if op.type == "Placeholder":
                continue
            resource = next((captures[t.op.name] for t in op.inputs
                             if t.dtype == tf.resource and t.op.name in captures), None)
            if resource is not None:
                op._set_device(resource)  # ops on a variable run where it lives
                report.placed += 1
                continue
            if any(t.dtype == tf.resource for t in op.inputs):
                # A resource passed through the step (a loop variable): the plan's device when
                # it names the op (its variable's group); anything else (an iterator, a
                # TensorArray) stays where TensorFlow puts it.
                if op.name in self._plan.placement:
                    op._set_device(self._plan.placement[op.name])
                    report.placed += 1
                continue
            if _colocation_target(op) is not None:
                colocated.append(op)  # TensorFlow keeps it with another op: placed after that one
                continue
            boundary = shard_boundary(op.name)
            if boundary is not None:
                # A cut runs where its input is made; a join where it is used (placed below).
                device = self._input_device(op) if boundary == "split" else None
                if device is None:
                    report.unplaced.append(op.name)
                else:
                    op._set_device(device)
                    report.placed += 1
                continue
            device, by_layer = self.device_for(op.name, op.type)
            if device is None and self._plan.data_parallel is not None and op.device:
                report.placed += 1  # the all-reduces and the batch's shares: placed where the step made them
                continue
            if device is None:
                report.unplaced.append(op.name)
                continue
            op._set_device(device)
            report.placed += 1
            report.by_layer += by_layer
        graph = ops[0].graph if ops else None
        self.tensor_bytes = {f"{op.name}:{i}": _static_bytes(t) for op in ops for i, t in enumerate(op.outputs)}
        for op in colocated:
            target = _colocation_target(op)
            try:
                anchor = by_name.get(target) or graph.get_operation_by_name(target)
            except (KeyError, ValueError):
                continue
            if anchor.device:
                op._set_device(anchor.device)
                report.placed += 1
        self._place_by_consumers(by_name, report)
        self._order(ops, by_name, report)
        self.last_report = report
        return report

    def _input_device(self, op: tf.Operation) -> str | None:
        """Where ``op``'s first input is made: its producer's device, else the plan's for it."""
        if not op.inputs:
            return None
        producer = op.inputs[0].op
        return producer.device or self.device_for(producer.name)[0]

    @staticmethod
    def _place_by_consumers(by_name: dict[str, tf.Operation], report: ApplyReport) -> None:
        """Ops without a device whose consumers all run on one device go there (last ops first,
        so a chain of them follows its end). A join of shards used on several devices is made
        once on each, as the simulator gathers once per consuming device; a constant or a scalar
        read on several devices goes to the first."""
        for name in reversed(list(report.unplaced)):
            op = by_name[name]
            users: dict[str, list[tuple[tf.Operation, int]]] = {}
            live = {c for tensor in op.outputs for c in tensor.consumers() if c.name in by_name}  # others never run
            for consumer in sorted(live, key=lambda c: c.name):
                for index, tensor in enumerate(consumer.inputs):
                    if tensor.op is op:
                        users.setdefault(normalize_device(consumer.device), []).append((consumer, index))
            read_anywhere = op.type == "Const" or _scalar(op)
            if not users or "" in users or (len(users) > 1 and not _copyable_join(op) and not read_anywhere):
                continue
            first, *others = sorted(users)
            # A constant read on several devices: TensorFlow folds it where read; a scalar (a
            # wave's share of the batch) is made once and sent.
            op._set_device(first)
            others = others if not read_anywhere else []
            for device in others:
                _join_on(op, device, users[device])
            report.unplaced.remove(name)
            report.placed += 1 + len(others)

    def _order(self, ops, by_name, report: ApplyReport) -> None:
        if not self._plan.order or self.skip_order:
            return
        if self._plan.data_parallel is not None:
            report.order_skipped = "a data-parallel plan's order is not applied: each replica runs in data-flow order"
            return
        keyed: dict[tuple[str, int, int], tf.Operation] = {}
        for op in ops:
            base, wave, shard = self.copy_of(op.name)
            keyed.setdefault((base, wave, -1 if base in self.runs_once else shard), op)
        folded = _folded_before_running(ops)
        chains = []
        for names in self._plan.order.values():
            # A fused chain's ops run in data-flow order: a control edge between them, or an op
            # ordered in between, keeps TensorFlow from fusing them, and the unfused kernels
            # cost a launch and round otherwise (graphtables.FUSED_GROUP).
            names = [task for task in names if parse_copy_name(task)[0] not in self.unordered]
            sequence = [op for op in (self._ordered_op(task, keyed, folded, report) for task in names) if op]
            chains.extend(zip(sequence, sequence[1:]))
        if not chains:
            return
        if _would_cycle(ops, chains):
            report.order_skipped = ("the plan's order contradicts this trace's data flow (the step differs "
                                    "from the profiled one); ops run in data-flow order")
            return
        for before, after in chains:
            if before not in after.control_inputs:
                after._add_control_input(before)
                report.ordered_edges += 1

    def _ordered_op(self, task: str, keyed: dict, folded: set[int], report: ApplyReport) -> tf.Operation | None:
        """The traced op that is ``task`` of the plan's order, if it is one to chain; a planned
        op that runs a kernel and is missing from the trace is recorded in ``report``."""
        base, _, wave, shard = parse_copy_name(task)
        op = keyed.get((base, wave, shard))
        if op is None or not self.is_planned_op(base, op.type):
            if self.op_type.get(base, "NoOp") not in METADATA_OP_TYPES:
                report.order_missing.append(task)
            return None
        # Stateful ops are ordered by tf.function itself (automatic control dependencies in
        # program order); chaining them too could close a cycle. Ops Grappler folds into
        # constants cost nothing to order, and a constant with control inputs is folded
        # otherwise: MobileNetV2's planned step rounded differently from plain Keras
        # (bit-identical without them) and an output Identity left its planned device.
        # Metadata ops (shapes, reshapes, identities) take no time, and Grappler's arithmetic
        # optimizer removes or merges them, moving their control edges to their neighbours: on
        # the mnist convnet, a bias Reshape -> Squeeze so removed closed a cycle through the
        # backward pass. The order goes around them.
        if op.type in METADATA_OP_TYPES or _stateful(op) or id(op) in folded:
            return None
        return op


def _summed_statistics_gradients(graph: OpGraph | None, plan: Plan) -> frozenset[str]:
    """The backward ops of the layers ``plan`` splits whose shards compute their statistics
    together. They run in data-flow order: TensorFlow sums the gradient of each whole-batch
    statistic where it aggregates the gradients of the statistic's readers, after each shard's
    own gradient ops, while the simulator sums it at the shards' reductions, earlier; an order
    among them made from the simulation can contradict the trace (HEFT around a split
    BatchNormalization, one profile in 40 with its costs perturbed by up to 50 %)."""
    if graph is None or not plan.splits:
        return frozenset()
    together = batch_statistics(graph).layer_ops
    return frozenset(op.name for i, op in enumerate(graph.ops)
                     if i in together and op.phase == "backward" and op.layer in plan.splits)


def _first_three(names: list[str]) -> str:
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def _scalar(op: tf.Operation) -> bool:
    return bool(op.outputs) and all(t.shape.rank == 0 for t in op.outputs)


def _copyable_join(op: tf.Operation) -> bool:
    """A join of shards (their concat), or a sum of gradients the tape made (a split weight's
    shards' parts, read by its update's ops): made once on each device that reads it, as the
    simulator gathers once per consuming device."""
    return (op.type == "ConcatV2" and shard_boundary(op.name) == "join") or op.type == "AddN"


def _join_on(join: tf.Operation, device: str, users: list[tuple[tf.Operation, int]]) -> None:
    """A copy of ``join`` (a concat or a sum, ``_copyable_join``) on ``device``, read by ``users`` instead of ``join``."""
    with join.graph.as_default(), tf.device(device), tf.compat.v1.name_scope(join.name + "/"):
        if join.type == "AddN":
            copy = tf.raw_ops.AddN(inputs=list(join.inputs), name="on_device")
        else:
            copy = tf.raw_ops.ConcatV2(values=list(join.inputs[:-1]), axis=join.inputs[-1], name="on_device")
    for consumer, index in users:
        consumer._update_input(index, copy)


def _static_bytes(tensor: tf.Tensor) -> float | None:
    """The size of ``tensor`` when its shape is fully known, else None."""
    shape = tensor.shape
    if shape.rank is None or not shape.is_fully_defined() or tensor.dtype in (tf.resource, tf.string, tf.variant):
        return None  # a handle, or elements of no fixed size
    return float(shape.num_elements() * tensor.dtype.size)


_SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank"})


def _folded_before_running(ops: list[tf.Operation]) -> set[int]:
    """The ids of ``ops`` that Grappler's constant folding computes before the step runs.

    Constants, the shape of a tensor whose shape is static, and stateless ops that read only
    such values. (``ops`` are in creation order, so an op's inputs come before it.)
    """
    folded: set[int] = set()
    for op in ops:
        if op.type == "Const":
            folded.add(id(op))
        elif op.type in _SHAPE_OPS:
            if all(t.shape.is_fully_defined() for t in op.inputs):
                folded.add(id(op))
        elif op.inputs and not _stateful(op) and all(id(t.op) in folded for t in op.inputs):
            folded.add(id(op))
    return folded


def _stateful(op: tf.Operation) -> bool:
    return bool(getattr(op, "_is_stateful", False)) or any(t.dtype == tf.resource for t in op.inputs)


def _colocation_target(op: tf.Operation) -> str | None:
    """The op ``op`` must be colocated with (TensorFlow's ``_class: loc:@name``), if another."""
    try:
        groups = op.colocation_groups()
    except (ValueError, AttributeError):
        return None
    for group in groups:
        name = group.decode() if isinstance(group, bytes) else str(group)
        name = name[len("loc:@"):] if name.startswith("loc:@") else name
        if name != op.name:
            return name
    return None


def _would_cycle(ops: list[tf.Operation], extra: list[tuple[tf.Operation, tf.Operation]]) -> bool:
    """True when adding ``extra`` edges (before -> after) could make the ops' graph cyclic.

    ``tf.function`` adds its automatic control dependencies after the step is traced, so
    they are not among the ops' edges yet; ``automatic_dependencies`` adds what they will be.
    """
    index = {id(op): i for i, op in enumerate(ops)}
    successors: list[list[int]] = [[] for _ in ops]

    def link(a, b):
        ia, ib = index.get(id(a)), index.get(id(b))
        if ia is not None and ib is not None:
            successors[ia].append(ib)

    for op in ops:
        for tensor in op.inputs:
            link(tensor.op, op)
        for control in op.control_inputs:
            link(control, op)
    for before, after in automatic_dependencies(ops) + list(extra):
        link(before, after)
    return bool(topological_order(successors)[1])


def automatic_dependencies(ops: list[tf.Operation]) -> list[tuple[tf.Operation, tf.Operation]]:
    """The edges ``tf.function``'s automatic control dependencies add among ``ops`` (or more).

    As TensorFlow does, in program order: per resource, a read waits for the last write and a
    write for the last write and every read since; stateful ops without a resource run one after
    another. Where TensorFlow's own read/write analysis is not available, every stateful op is
    chained in program order instead, which orders at least as much.
    """
    try:
        from tensorflow.python.framework.auto_control_deps import _get_resource_inputs, ResourceType
    except ImportError:
        stateful = [op for op in ops if _stateful(op)]
        return list(zip(stateful, stateful[1:]))
    edges = []
    last_write: dict = {}
    reads_since: dict = {}
    last_stateful = None
    for op in ops:
        touched = set()
        for tensor, kind in _get_resource_inputs(op):
            key = tensor.ref()
            if key in touched:
                continue
            touched.add(key)
            if key in last_write:
                edges.append((last_write[key], op))
            if kind == ResourceType.READ_ONLY:
                reads_since.setdefault(key, []).append(op)
            else:
                edges.extend((read, op) for read in reads_since.pop(key, []))
                last_write[key] = op
        if not touched and getattr(op, "_is_stateful", False):
            if last_stateful is not None:
                edges.append((last_stateful, op))
            last_stateful = op
    return edges
