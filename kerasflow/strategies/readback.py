"""Reads where the planned step's ops really ran, and what crossed devices, from one executed step.

TensorFlow records the partition graphs (one per device) of the next function call once
``enable_run_metadata`` is on; every op is compared with the device the plan gave it, and
every tensor sent from one device's partition to another's is listed with its size.
"""

from __future__ import annotations

import dataclasses

from kerasflow.devices import normalize_device
from kerasflow.strategies.applier import PlanApplier

__all__ = ["ExecutedTransfer", "PlacementMismatch", "PlacementReport", "start_recording", "read_back"]

_NOT_PLACED = ("_Send", "_Recv", "_Arg", "_Retval", "NoOp", "Const")
# Ops on lookup tables run where the table was created, whatever a plan says.
_TABLE_OPS = ("LookupTable", "HashTable", "InitializeTable", "MutableHashTable", "MutableDenseHashTable")
_RESOURCE_OPS = ("ReadVariableOp", "VariableShape", "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
                 "ResourceApply", "ResourceGather", "ResourceScatter", "VarHandleOp", "VarIsInitializedOp")


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


class PlacementReport(list):
    """The ops that did not land where the plan put them, and whether the plan is in force now.

    A list of ``PlacementMismatch`` (empty when every op ran where planned), with
    ``in_force`` (False once training went back to the default placement, or when the planner
    kept it: ``default_kept``), ``fallback`` (why, else None), ``not_applied`` (the parts of the
    plan that are not running, each with its reason: a per-device order TensorFlow refused, ops
    the plan has no device for)
    and ``transfers`` (the ``ExecutedTransfer`` list of the step read back: what crossed devices).

    Example:
        >>> report = PlacementReport([], in_force=False, fallback="rebuilding failed")
        >>> report == [], report.in_force
        (True, False)
        >>> PlacementReport([], not_applied=["the per-device order (a cycle)"]).summary()
        'Ops placed where planned: all. Not applied: the per-device order (a cycle).'
    """

    def __init__(self, mismatches=(), *, in_force: bool = True, fallback: str | None = None,
                 not_applied=(), transfers=(), default_kept: bool = False):
        super().__init__(mismatches)
        self.in_force = in_force
        self.default_kept = default_kept
        self.fallback = fallback
        self.not_applied = list(not_applied)
        self.transfers = list(transfers)

    def summary(self) -> str:
        """One line: whether the plan is in force, how many ops ran off it, and what is not applied."""
        if self.default_kept:
            return f"Plan not in force: the planner kept the default placement ({self.fallback})."
        if not self.in_force:
            return f"Plan not in force: training went back to the default placement ({self.fallback})."
        line = "Ops placed where planned: " + ("all" if not self else f"all but {len(self)}")
        return line + (f". Not applied: {'; '.join(self.not_applied)}." if self.not_applied else "")


class PlacementCheck:
    """Reads back where the first step of each plan put its ops (``read_back``): ``arm`` after a
    switch, ``before_step`` records the next step, ``after_step`` reads it back.

    Attributes:
        mismatches: the ops off the plan (None before a plan ran a step).
        transfers: what that step sent between devices.
    """

    def __init__(self):
        self.armed = False
        self.mismatches: list | None = None
        self.transfers: list = []

    def arm(self) -> None:
        """The next step is the first of a plan: record it."""
        self.armed = True

    def before_step(self) -> None:
        """Records the step about to run, when armed."""
        if self.armed:
            start_recording()

    def after_step(self, applier: PlanApplier) -> bool:
        """Reads the recorded step back; True when it did (the plan's first step ran)."""
        if not self.armed:
            return False
        self.armed = False
        self.mismatches, self.transfers = read_back(applier)
        return True


def start_recording() -> None:
    """Records the partition graphs of the next function call."""
    from tensorflow.python.eager import context

    context.context().enable_run_metadata()


def read_back(applier: PlanApplier) -> tuple[list[PlacementMismatch], list[ExecutedTransfer]]:
    """The ops of the recorded step that ran off the plan, and the tensors it sent between
    devices (stops recording)."""
    from tensorflow.python.eager import context

    metadata = context.context().export_run_metadata()
    context.context().disable_run_metadata()
    if metadata is None:
        return [], []
    step = _last_step(metadata.partition_graphs)
    return _mismatches(applier, step), _transfers(applier, step)


def _mismatches(applier: PlanApplier, partition_graphs) -> list[PlacementMismatch]:
    plan = applier.plan
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
                planned, _ = applier.device_for(name)
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
