"""Reads where the planned step's ops really ran, and what crossed devices, from one executed step.

TensorFlow records the partition graphs (one per device) of the next function call once
``enable_run_metadata`` is on; every op is compared with the device the plan gave it, every
tensor sent from one device's partition to another's is listed with its size, so is every
device's op of a collective all-reduce (whose sends the partition graphs do not show), and the
kernels TensorFlow's graph optimizer fused from chains of ops are counted (``fused_kernel_count``).
"""

from __future__ import annotations

import dataclasses

from kerasflow.devices import normalize_device
from kerasflow.planner.ir.plan import Plan
from kerasflow.strategies.applier import PlanApplier

__all__ = ["ExecutedTransfer", "ExecutedCollective", "ExecutedStep", "PlacementMismatch", "PlacementReport",
           "start_recording", "stop_recording", "read_back", "fused_kernel_count"]

_NOT_PLACED = ("_Send", "_Recv", "_Arg", "_Retval", "NoOp", "Const")
# Ops on lookup tables run where the table was created, whatever a plan says.
_TABLE_OPS = ("LookupTable", "HashTable", "InitializeTable", "MutableHashTable", "MutableDenseHashTable")
_RESOURCE_OPS = ("ReadVariableOp", "VariableShape", "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
                 "ResourceApply", "ResourceGather", "ResourceScatter", "VarHandleOp", "VarIsInitializedOp")
# The oneDNN prefixes of an internal op type ("_MklNativeFusedConv2D": "_", "Mkl", "Native").
_INTERNAL_PREFIXES = ("Mkl", "Native")


@dataclasses.dataclass
class PlacementMismatch:
    """An op that did not land where the plan put it."""

    op: str
    planned: str
    actual: str


@dataclasses.dataclass(frozen=True)
class ExecutedTransfer:
    """A tensor the executed step sent from one device to another.

    Attributes:
        tensor: the producer's output, ``"<op>:<index>"`` (as TensorFlow's optimizer left
            it: it may fold constants and rewrite arithmetic before partitioning).
        src, dst: the devices.
        bytes: its size, from the traced step's static shape (None when a dimension is unknown).
    """

    tensor: str
    src: str
    dst: str
    bytes: float | None


@dataclasses.dataclass(frozen=True)
class ExecutedCollective:
    """One op of a collective the executed step ran: a device's part of an all-reduce.

    Attributes:
        op: its name in the traced step.
        device: the device it ran on.
        bytes: the size of the value it sums, from the traced step's static shape.
    """

    op: str
    device: str
    bytes: float | None


@dataclasses.dataclass(frozen=True)
class ExecutedStep:
    """What one recorded step did (``read_back``).

    Attributes:
        mismatches: the ``PlacementMismatch`` list: ops that did not run where planned.
        transfers: the ``ExecutedTransfer`` list: tensors sent from one device to another.
        collectives: the ``ExecutedCollective`` list: every device's op of every all-reduce.
        fused_kernels: how many fused kernels it ran (``fused_kernel_count``).
    """

    mismatches: list
    transfers: list
    collectives: list
    fused_kernels: int


class PlacementReport(list):
    """The ops that did not land where the plan put them, and whether the plan is in force now.

    A list of ``PlacementMismatch`` (empty when every op ran where planned), with
    ``in_force`` (False once training went back to the default placement, or when the planner
    kept it: ``default_kept``), ``fallback`` (why, else None), ``not_applied`` (the parts of the
    plan that are not running, each with its reason: a per-device order TensorFlow refused, ops
    the plan has no device for), and what the step read back did: ``transfers`` (the
    ``ExecutedTransfer`` list: what crossed devices), ``collectives`` (the ``ExecutedCollective``
    list: a data-parallel plan's all-reduces, one op per device) and ``fused_kernels`` (how many
    fused kernels it ran, ``fused_kernel_count``; None when no step was read back).

    Example:
        >>> report = PlacementReport([], in_force=False, fallback="rebuilding failed")
        >>> report == [], report.in_force
        (True, False)
        >>> PlacementReport([], not_applied=["the per-device order (a cycle)"]).summary()
        'Ops placed where planned: all. Not applied: the per-device order (a cycle).'
    """

    def __init__(self, mismatches=(), *, in_force: bool = True, fallback: str | None = None,
                 not_applied=(), default_kept: bool = False, transfers=(), collectives=(),
                 fused_kernels: int | None = None):
        super().__init__(mismatches)
        self.in_force = in_force
        self.default_kept = default_kept
        self.fallback = fallback
        self.not_applied = list(not_applied)
        self.transfers = list(transfers)
        self.collectives = list(collectives)
        self.fused_kernels = fused_kernels

    @classmethod
    def of_step(cls, step: ExecutedStep, *, in_force: bool, not_applied=()) -> "PlacementReport":
        """The report of a plan whose first step ``step`` was read back."""
        return cls(step.mismatches, in_force=in_force, not_applied=not_applied, transfers=step.transfers,
                   collectives=step.collectives, fused_kernels=step.fused_kernels)

    def summary(self) -> str:
        """One line: whether the plan is in force, how many ops ran off it, and what is not applied."""
        if self.default_kept:
            return f"Plan not in force: the planner kept the default placement ({self.fallback})."
        if not self.in_force:
            return f"Plan not in force: training went back to the default placement ({self.fallback})."
        line = "Ops placed where planned: " + ("all" if not self else f"all but {len(self)}")
        return line + (f". Not applied: {'; '.join(self.not_applied)}." if self.not_applied else "")


class PlacementCheck:
    """Reads back what the first step of each plan did (``read_back``): ``arm`` after a switch,
    ``before_step`` records the next step, ``after_step`` reads it back.

    Attributes:
        executed: the ``ExecutedStep`` read back (None before a plan ran a step).
    """

    def __init__(self):
        self.armed = False
        self.executed: ExecutedStep | None = None

    def arm(self) -> None:
        """The next step is the first of a plan: record it."""
        self.armed = True

    def before_step(self) -> None:
        """Records the step about to run, when armed."""
        if self.armed:
            start_recording()

    def after_step(self, applier: PlanApplier, plan: Plan) -> bool:
        """Reads the recorded step back (``plan`` applied by ``applier``); True when it did (the
        plan's first step ran)."""
        if not self.armed:
            return False
        self.armed = False
        self.executed = read_back(applier, plan)
        return True


def start_recording() -> None:
    """Records the partition graphs of the next function call."""
    from tensorflow.python.eager import context

    # TensorFlow keeps adding to the metadata until it is exported: drop what a recording that
    # was never stopped (a step that failed) left, so only the next call is read.
    context.context().export_run_metadata()
    context.context().enable_run_metadata()


def stop_recording() -> list:
    """Stops recording and returns the partition graphs recorded since ``start_recording``.

    TensorFlow records a function's partition graphs when it instantiates the function: record
    the call that traces a step (a plan's first step, ``fit``'s first) to read that step.

    Example:
        >>> import tensorflow as tf
        >>> dense = tf.function(lambda x, w, b: tf.nn.relu(tf.nn.bias_add(tf.matmul(x, w), b)))
        >>> start_recording()
        >>> _ = dense(tf.ones((4, 3)), tf.ones((3, 2)), tf.zeros(2))  # traced, instantiated: recorded
        >>> fused_kernel_count(stop_recording())  # the matmul, its bias and activation: one kernel
        1
    """
    from tensorflow.python.eager import context

    metadata = context.context().export_run_metadata()
    context.context().disable_run_metadata()
    return list(metadata.partition_graphs) if metadata is not None else []


def read_back(applier: PlanApplier, plan: Plan) -> ExecutedStep:
    """What the recorded step did (stops recording): its ops that ran off the plan, the tensors
    it sent between devices, its collectives and how many fused kernels it ran."""
    step = _last_step(stop_recording())
    return ExecutedStep(_mismatches(applier, plan, step), _transfers(applier, step), _collectives(applier, step),
                        fused_kernel_count(step))


def fused_kernel_count(partition_graphs) -> int:
    """How many fused kernels the partition graphs of an executed step run.

    Grappler's remapper (and oneDNN's layout pass, on CPU) replaces a chain of ops with one
    internal kernel: a convolution or matmul with its bias and activation (``_FusedConv2D``,
    ``_FusedMatMul``, on CPU ``_MklNativeFusedConv2D``, ``_MklNativeFusedMatMul``), a filter's
    gradient with its bias' gradient (``_MklNativeConv2DBackpropFilterWithBias``), a
    normalization with its activation (``_FusedBatchNormEx``, ``_MklNativeFusedBatchNormEx``).
    It fuses a chain only when no control edge touches it, so a plan's order that reached into
    a chain runs fewer of them than the default placement does. The rule: a node counts when
    its op type is internal (starts with ``_``) and names a fusion (contains ``Fused`` or
    ``WithBias``), but for oneDNN's forms of TensorFlow's own batch normalization
    (``_MklNativeFusedBatchNormV3`` is ``FusedBatchNormV3``, one op that fuses nothing; its
    ``Ex`` forms do).

    Args:
        partition_graphs: ``GraphDef`` s, as ``RunMetadata.partition_graphs`` holds them.

    Example:
        >>> from tensorflow.core.framework import graph_pb2
        >>> types = ("_MklNativeFusedConv2D", "_MklNativeConv2DBackpropFilterWithBias", "_FusedBatchNormEx",
        ...          "_MklNativeFusedBatchNormV3", "FusedBatchNormV3", "_MklMatMul", "Relu")
        >>> step = graph_pb2.GraphDef(node=[dict(name=f"op{i}", op=kind) for i, kind in enumerate(types)])
        >>> fused_kernel_count([step])
        3
    """
    return sum(_is_fused_kernel(node.op) for partition in partition_graphs for node in partition.node)


def _is_fused_kernel(op_type: str) -> bool:
    if not op_type.startswith("_"):
        return False  # FusedBatchNormV3 and kin are TensorFlow's public single ops
    core = op_type.lstrip("_")
    for prefix in _INTERNAL_PREFIXES:
        core = core.removeprefix(prefix)
    if core.startswith("FusedBatchNorm"):
        return core.endswith("Ex")  # only the Ex forms fuse an activation (and a side input)
    return "Fused" in core or "WithBias" in core


def _mismatches(applier: PlanApplier, plan: Plan, partition_graphs) -> list[PlacementMismatch]:
    # A name can appear in several partition graphs (a function the step calls, instantiated
    # on more than one device): an op is where the plan put it if any of its instances is.
    actual: dict[str, set[str]] = {}
    planned_of: dict[str, str] = {}
    for partition in partition_graphs:
        for node in partition.node:
            name = _strip_call(node.name)
            if (name is None or node.op in _NOT_PLACED or node.op.startswith(_TABLE_OPS)
                    or _partitioner_made(name)):
                continue
            base, _, shard = applier.copy_of(name)
            if node.op.startswith(_RESOURCE_OPS):
                # Runs where its variable lives: compare with the variable's planned home.
                planned = plan.placement.get(base) if shard < 0 else None
            else:
                # Asked as the applier asked when it placed the op: a traced op whose profiled
                # namesake is of another type (a Shape the profiled run folded into a Const) is
                # placed by its layer, or left to TensorFlow, not at the namesake's device.
                planned, _ = applier.device_for(name, applier.traced_types.get(name))
                if base not in plan.placement and shard < 0 and plan.data_parallel is None:
                    planned = None
            if planned is None:
                continue
            planned_of[name] = planned
            actual.setdefault(name, set()).add(normalize_device(node.device))
    return [PlacementMismatch(name, planned_of[name], ", ".join(sorted(devices)))
            for name, devices in sorted(actual.items()) if planned_of[name] not in devices]


def _last_step(partition_graphs) -> list:
    """The partition graphs of the step's last instantiation: the trailing run of graphs that
    hold the step's ops, one per device (an earlier instantiation's graphs come before)."""
    last, devices = [], set()
    for partition in reversed(partition_graphs):
        device = partition.node[0].device if partition.node else ""
        if device in devices or not any(_strip_call(node.name) for node in partition.node):
            break
        devices.add(device)
        last.append(partition)
    return last[::-1]


def _transfers(applier: PlanApplier, partition_graphs) -> list[ExecutedTransfer]:
    """The data each partition sends to another (control edges, which carry nothing, left out)."""
    nodes = {node.name: node for partition in partition_graphs for node in partition.node}
    transfers = []
    for partition in partition_graphs:
        for node in partition.node:
            if node.op != "_Send" or node.input[0].startswith("^") or "/ctrl/" in node.input[0]:
                continue
            tensor = _strip_call(_loop_value(node.input[0], nodes)) or node.input[0]
            tensor = tensor if ":" in tensor else tensor + ":0"
            transfers.append(ExecutedTransfer(tensor, normalize_device(node.attr["send_device"].s.decode()),
                                              normalize_device(node.attr["recv_device"].s.decode()),
                                              applier.tensor_bytes.get(tensor)))
    return transfers


def _collectives(applier: PlanApplier, partition_graphs) -> list[ExecutedCollective]:
    """Every device's op of every collective all-reduce (``strategies.collectives``)."""
    collectives = []
    for partition in partition_graphs:
        for node in partition.node:
            name = _strip_call(node.name)
            if node.op.startswith("CollectiveReduce") and name is not None:
                collectives.append(ExecutedCollective(name, normalize_device(node.device),
                                                      applier.tensor_bytes.get(f"{name}:0")))
    return collectives


def _loop_value(tensor: str, nodes: dict) -> str:
    """For a value leaving a loop TensorFlow lowered into frames (``Exit`` <- ``Switch`` <-
    ``Merge`` <- ``Enter``), the traced tensor that entered the loop as that value (a loop
    value keeps its shape, so it has that tensor's size); any other tensor as it is."""
    name = tensor.split(":")[0]
    for kind in ("Exit", "Switch", "Merge", "Enter"):
        node = nodes.get(name)
        if node is None or node.op != kind or not node.input:
            return tensor
        name = node.input[0].split(":")[0] if kind != "Enter" else node.input[0]
    return name


def _partitioner_made(name: str) -> bool:
    """Whether TensorFlow's partitioner added the node: it names what it adds to carry a control
    edge between devices (a ``_Recv`` and the ``Identity`` after it) ``<source op>/_<number>``,
    on the destination's device.

    Example:
        >>> _partitioner_made("wave0/model/dense/BiasAdd/_18"), _partitioner_made("model/dense/BiasAdd")
        (True, False)
    """
    last = name.rsplit("/", 1)[-1]
    return last.startswith("_") and last[1:].isdigit()


def _strip_call(name: str) -> str | None:
    """The step's op name inside fit's graph (inlined under a call prefix), else None."""
    parts = name.split("/")
    stripped = 0
    while parts and parts[0].startswith(("StatefulPartitionedCall", "PartitionedCall", "__inference")):
        parts = parts[1:]
        stripped += 1
    return "/".join(parts) if stripped and parts else None
