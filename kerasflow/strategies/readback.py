"""Reads where the planned step's ops really ran, from the partition graphs of one executed step.

TensorFlow records the partition graphs (one per device) of the next function call once
``enable_run_metadata`` is on; every op is compared with the device the plan gave it.
"""

from __future__ import annotations

import dataclasses

from kerasflow.devices import normalize_device
from kerasflow.strategies.applier import PlanApplier
from kerasflow.strategies.scopes import split_name

__all__ = ["PlacementMismatch", "PlacementReport", "start_recording", "read_placement"]

_NOT_PLACED = ("_Send", "_Recv", "_Arg", "_Retval", "NoOp", "Const")
# Ops on lookup tables run where the table was created, whatever a plan says.
_TABLE_OPS = ("LookupTable", "HashTable", "InitializeTable", "MutableHashTable", "MutableDenseHashTable")
_RESOURCE_OPS = ("ReadVariableOp", "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
                 "ResourceApply", "ResourceGather", "ResourceScatter", "VarHandleOp", "VarIsInitializedOp")


@dataclasses.dataclass
class PlacementMismatch:
    """An op that did not land where the plan put it."""

    op: str
    planned: str
    actual: str


class PlacementReport(list):
    """The ops that did not land where the plan put them, and whether the plan is in force now.

    A list of ``PlacementMismatch`` (empty when every op ran where planned), with
    ``in_force`` (False once training went back to the default placement), ``fallback``
    (why it did, else None) and ``not_applied`` (the parts of the plan that are not running,
    each with its reason: a per-device order TensorFlow refused, ops the plan has no device for).

    Example:
        >>> report = PlacementReport([], in_force=False, fallback="rebuilding failed")
        >>> report == [], report.in_force
        (True, False)
        >>> PlacementReport([], not_applied=["the per-device order (a cycle)"]).summary()
        'Ops placed where planned: all. Not applied: the per-device order (a cycle).'
    """

    def __init__(self, mismatches=(), *, in_force: bool = True, fallback: str | None = None,
                 not_applied=()):
        super().__init__(mismatches)
        self.in_force = in_force
        self.fallback = fallback
        self.not_applied = list(not_applied)

    def summary(self) -> str:
        """One line: whether the plan is in force, how many ops ran off it, and what is not applied."""
        if not self.in_force:
            return f"Plan not in force: training went back to the default placement ({self.fallback})."
        line = "Ops placed where planned: " + ("all" if not self else f"all but {len(self)}")
        return line + (f". Not applied: {'; '.join(self.not_applied)}." if self.not_applied else "")


def start_recording() -> None:
    """Records the partition graphs of the next function call."""
    from tensorflow.python.eager import context

    context.context().enable_run_metadata()


def read_placement(applier: PlanApplier) -> list[PlacementMismatch]:
    """The ops of the recorded step that ran off the plan (stops recording)."""
    from tensorflow.python.eager import context

    metadata = context.context().export_run_metadata()
    context.context().disable_run_metadata()
    if metadata is None:
        return []
    plan = applier.plan
    # A name can appear in several partition graphs (functions instantiated more than
    # once): an op is where the plan put it if any of its instances is.
    actual: dict[str, set[str]] = {}
    planned_of: dict[str, str] = {}
    for partition in metadata.partition_graphs:
        for node in partition.node:
            name = _strip_call(node.name)
            if name is None or node.op in _NOT_PLACED or node.op.startswith(_TABLE_OPS):
                continue
            base, _, shard = split_name(name)
            if node.op.startswith(_RESOURCE_OPS):
                # Runs where its variable lives: compare with the variable's planned home.
                planned = plan.placement.get(base) if shard < 0 else None
            else:
                planned, _ = applier.device_for(name)
                if base not in plan.placement and shard < 0:
                    planned = None
            if planned is None:
                continue
            planned_of[name] = planned
            actual.setdefault(name, set()).add(normalize_device(node.device))
    return [PlacementMismatch(name, planned_of[name], ", ".join(sorted(devices)))
            for name, devices in sorted(actual.items()) if planned_of[name] not in devices]


def _strip_call(name: str) -> str | None:
    """The step's op name inside fit's graph (inlined under a call prefix), else None."""
    parts = name.split("/")
    stripped = 0
    while parts and parts[0].startswith(("StatefulPartitionedCall", "PartitionedCall", "__inference")):
        parts = parts[1:]
        stripped += 1
    return "/".join(parts) if stripped and parts else None
