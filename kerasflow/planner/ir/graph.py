"""The planning IR: ``OpGraph``, one training step as ops, tensors and their costs.

Every part of kerasflow speaks this IR: the profiler writes it, the planner and the
simulator read it. Costs and activation sizes depend on the batch, so each is an
``Affine`` function of the batch size (``fixed + per_sample * batch``); the planner
uses that to price shards, micro-batches and other batch sizes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from .. import _jsonio
from ..errors import InvalidGraphError
from .toposort import topological_order

__all__ = ["Affine", "Op", "Edge", "OpGraph", "PHASES", "GRAPH_FORMAT_VERSION", "HOST_GROUP"]

PHASES = ("forward", "backward", "update", "other")
# The colocation groups of ops only a host's CPU can run ("kerasflow:host/<layer>", one per layer):
# string ops (preprocessing layers, string inputs) and ops on lookup tables, which live where they
# were created. The profiler writes them (``profiling.capture``); the planner keeps them on the
# cluster's host (``Cluster.host``) and never splits them.
HOST_GROUP = "kerasflow:host"
GRAPH_FORMAT_VERSION = 1
_GRAPH_KIND = "kerasflow.OpGraph"


class Affine(NamedTuple):
    """A quantity that grows linearly with the batch: ``fixed + per_sample * batch``.

    Used for op costs (seconds) and tensor sizes (bytes). Weights have
    ``per_sample == 0``; activations are mostly ``per_sample``.

    Example:
        >>> Affine(1e-5, 2e-6).at(32)
        7.4e-05
        >>> Affine.of(128)
        Affine(fixed=128.0, per_sample=0.0)
    """

    fixed: float
    per_sample: float = 0.0

    def at(self, batch: float) -> float:
        """The value at ``batch`` samples."""
        return self.fixed + self.per_sample * batch

    @property
    def scales_with_batch(self) -> bool:
        """True when the value depends on the batch size."""
        return self.per_sample != 0.0

    @classmethod
    def of(cls, value: Any, *, what: str = "value", where: str = "") -> "Affine":
        """Builds an ``Affine`` from a number, a ``(fixed, per_sample)`` pair or a mapping.

        Args:
            value: ``3.0``, ``(1.0, 0.5)``, ``{"fixed": 1.0, "per_sample": 0.5}`` or an Affine.
            what: the field's name in the error message, e.g. ``"cost['V100']"``.
            where: what holds the field, for the message, e.g. ``"op 'a': "``.

        Returns:
            The ``Affine``.

        Raises:
            InvalidGraphError: the value is not a number or pair, each part non-negative and
                at most 1e18 (``_jsonio.MAX_MAGNITUDE``).
        """
        if isinstance(value, Affine):
            fixed, per_sample = value
        elif isinstance(value, Mapping):
            fixed, per_sample = value.get("fixed", 0.0), value.get("per_sample", 0.0)
        elif isinstance(value, (list, tuple)) and len(value) == 2:
            fixed, per_sample = value
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            fixed, per_sample = value, 0.0
        else:
            raise InvalidGraphError(
                f"{where}field '{what}' must be a number or a [fixed, per_sample] pair; "
                f"received {_jsonio.shown(value)}."
            )
        for part in (fixed, per_sample):
            _jsonio.check_number(part, what, InvalidGraphError, where=where, received=value,
                                 fix="costs are seconds and sizes are bytes: re-profile or fix the file")
        return cls(float(fixed), float(per_sample))


_ZERO = Affine(0.0, 0.0)


@dataclasses.dataclass(frozen=True)
class Op:
    """One op of a training step.

    Args:
        name: unique name (the traced TensorFlow op name).
        type: op type, e.g. ``"MatMul"``.
        layer: Keras layer path the op belongs to, or None.
        phase: ``"forward"``, ``"backward"``, ``"update"`` or ``"other"``.
        cost: seconds per device kind, each an ``Affine`` of the batch
            (``{"V100": Affine(5e-6, 1e-7)}``; a plain number means a fixed cost).
        output_bytes: size of each output, each an ``Affine`` of the batch.
        temp_bytes: scratch memory held while the op runs.
        persistent_bytes: weights and optimizer slots the op owns (variables only).
        colocation: name of the group of ops that must share one device
            (a variable, its reads and its updates), or None.
        batch_axis: the axis along which the op can be split over the batch,
            or None when it cannot be split.
        flops: floating-point operations, for static cost estimates.
        bytes_accessed: bytes read and written, for static cost estimates.

    Example:
        >>> op = Op("dense/MatMul", type="MatMul", layer="dense", cost={"V100": (5e-6, 1e-7)},
        ...         output_bytes=[(0, 512)], batch_axis=0)
        >>> round(op.cost["V100"].at(100), 9), op.splittable
        (1.5e-05, True)
    """

    name: str
    type: str = ""
    layer: str | None = None
    phase: str = "forward"
    cost: Mapping[str, Affine] = dataclasses.field(default_factory=dict)
    output_bytes: tuple[Affine, ...] = ()
    temp_bytes: Affine = _ZERO
    persistent_bytes: int = 0
    colocation: str | None = None
    batch_axis: int | None = None
    flops: Affine = _ZERO
    bytes_accessed: Affine = _ZERO

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise InvalidGraphError(f"Every op needs a non-empty string name; received {self.name!r}.")
        where = f"op {self.name!r}"
        for field in ("type", "layer", "colocation"):
            value = getattr(self, field)
            if not (isinstance(value, str) or (value is None and field != "type")):
                raise InvalidGraphError(
                    f"{where}: field {field!r} must be a string{'' if field == 'type' else ' or null'}; "
                    f"received {value!r}."
                )
        if not isinstance(self.phase, str) or self.phase not in PHASES:
            raise InvalidGraphError(
                f"{where}: field 'phase' must be one of {PHASES}; received {self.phase!r}."
            )
        if not isinstance(self.cost, Mapping):
            raise InvalidGraphError(
                f"{where}: field 'cost' must map device kinds to seconds; received {self.cost!r}."
            )
        cost = {
            str(kind): Affine.of(value, what=f"cost[{kind!r}]", where=f"{where}: ")
            for kind, value in sorted(self.cost.items())
        }
        object.__setattr__(self, "cost", _FrozenDict(cost))
        if isinstance(self.output_bytes, (str, bytes, Mapping)) or not isinstance(
            self.output_bytes, Iterable
        ):
            raise InvalidGraphError(
                f"{where}: field 'output_bytes' must be a list (one size per output); "
                f"received {self.output_bytes!r}."
            )
        outputs = tuple(
            Affine.of(value, what=f"output_bytes[{i}]", where=f"{where}: ")
            for i, value in enumerate(self.output_bytes)
        )
        object.__setattr__(self, "output_bytes", outputs)
        for field in ("temp_bytes", "flops", "bytes_accessed"):
            value = Affine.of(getattr(self, field), what=field, where=f"{where}: ")
            object.__setattr__(self, field, value)
        persistent = _jsonio.check_number(self.persistent_bytes, "persistent_bytes", InvalidGraphError,
                                          where=f"{where}: ", fix="weights are bytes: re-profile or fix the file")
        object.__setattr__(self, "persistent_bytes", int(persistent))
        if self.batch_axis is not None and (
            isinstance(self.batch_axis, bool) or not isinstance(self.batch_axis, int)
        ):
            raise InvalidGraphError(
                f"{where}: field 'batch_axis' must be an integer axis or null; "
                f"received {self.batch_axis!r}."
            )

    @property
    def splittable(self) -> bool:
        """True when the op can be split along the batch."""
        return self.batch_axis is not None

    @property
    def host_only(self) -> bool:
        """True when only a host's CPU can run the op (its colocation group is a ``HOST_GROUP``).

        Example:
            >>> Op("lookup/LookupTableFindV2", colocation=HOST_GROUP + "/lookup").host_only
            True
        """
        return self.colocation is not None and self.colocation.startswith(HOST_GROUP)

    def duration(self, kind: str, batch: float, speed: float = 1.0) -> float:
        """Seconds this op takes on a device of ``kind`` and relative ``speed``.

        Raises:
            InvalidGraphError: the op has no cost for ``kind``.
        """
        try:
            cost = self.cost[kind]
        except KeyError:
            raise InvalidGraphError(
                f"op {self.name!r} has no cost for device kind {kind!r} (it has "
                f"{sorted(self.cost) or 'none'}). Profile on that device, or estimate costs "
                "for it with kerasflow.planner.costmodel.estimate_costs(graph, kind)."
            ) from None
        return (cost.fixed + cost.per_sample * batch) / speed

    def to_dict(self) -> dict:
        """The op as JSON-ready data (inverse of ``Op.from_dict``)."""
        data: dict[str, Any] = {"name": self.name, "type": self.type, "layer": self.layer,
                                "phase": self.phase,
                                "cost": {k: list(v) for k, v in self.cost.items()},
                                "output_bytes": [list(b) for b in self.output_bytes]}
        if self.temp_bytes != _ZERO:
            data["temp_bytes"] = list(self.temp_bytes)
        if self.persistent_bytes:
            data["persistent_bytes"] = self.persistent_bytes
        if self.colocation is not None:
            data["colocation"] = self.colocation
        if self.batch_axis is not None:
            data["batch_axis"] = self.batch_axis
        if self.flops != _ZERO:
            data["flops"] = list(self.flops)
        if self.bytes_accessed != _ZERO:
            data["bytes_accessed"] = list(self.bytes_accessed)
        return data

    @classmethod
    def from_dict(cls, data: Mapping) -> "Op":
        """Builds an op from ``to_dict`` data; unknown or missing fields raise clearly."""
        if not isinstance(data, Mapping):
            raise InvalidGraphError(f"Each op must be a JSON object; received {data!r}.")
        fields = {f.name for f in dataclasses.fields(cls)}
        name = data.get("name")
        unknown = sorted(set(data) - fields)
        if unknown:
            raise InvalidGraphError(
                f"op {name!r}: unknown field(s) {unknown}; known fields are {sorted(fields)}."
            )
        if "name" not in data:
            raise InvalidGraphError(f"An op has no 'name' field: {dict(data)!r}.")
        return cls(**data)


class _FrozenDict(dict):
    """A dict that refuses mutation, so ops stay immutable and hashable by identity."""

    def _refuse(self, *args, **kwargs):
        raise TypeError("Op fields are immutable; build a new Op with dataclasses.replace().")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse  # type: ignore

    def __reduce__(self):  # pickled as a plain dict, made frozen again (a plan or graph sent to a process)
        return type(self), (dict(self),)


class Edge(NamedTuple):
    """A tensor (or a control dependency) from one op to another.

    Args:
        src: producer op name.
        dst: consumer op name.
        output: index of the producer's output the consumer reads, or None for a
            control edge (0 bytes).

    Example:
        >>> Edge("dense/MatMul", "dense/BiasAdd", 0)
        Edge(src='dense/MatMul', dst='dense/BiasAdd', output=0)
    """

    src: str
    dst: str
    output: int | None = 0


class _Structure:
    """Integer-indexed adjacency the simulator and schedulers iterate over (built once)."""

    __slots__ = ("index", "outputs", "preds", "succs", "topo", "cache")

    def __init__(self, ops: Sequence[Op], edges: Sequence[Edge]):
        self.index = {op.name: i for i, op in enumerate(ops)}
        n = len(ops)
        # outputs[i]: ((output index or -1 for control, (consumer indices...)), ...)
        grouped: list[dict[int, list[int]]] = [dict() for _ in range(n)]
        preds: list[list[int]] = [[] for _ in range(n)]
        succs: list[list[int]] = [[] for _ in range(n)]
        index = self.index
        for edge in edges:
            s, d = index[edge.src], index[edge.dst]
            key = -1 if edge.output is None else edge.output
            grouped[s].setdefault(key, []).append(d)
            preds[d].append(s)
            succs[s].append(d)
        self.outputs = [tuple((k, tuple(v)) for k, v in sorted(g.items())) for g in grouped]
        self.preds = [tuple(p) for p in preds]
        self.succs = [tuple(s) for s in succs]
        self.topo = self._topological(n)
        # Derived tables (per batch, per device kind) other modules memoise here; safe
        # because a graph never changes.
        self.cache: dict = {}

    def _topological(self, n: int) -> tuple[int, ...]:
        order, stuck = topological_order(self.succs)
        if stuck:
            raise _CycleFound(stuck)
        return tuple(order)


class _CycleFound(Exception):
    def __init__(self, stuck: list[int]):
        super().__init__(stuck)
        self.stuck = stuck


class OpGraph:
    """One training step (forward, backward, optimizer update) as a DAG of ops.

    The graph is immutable: algorithms return new graphs and plans, never edit one.

    Args:
        ops: the ops, names unique.
        edges: data and control edges between them.
        batch_size: the batch the costs were measured at (the default for planning).
        name: a label, e.g. the model's name.
        metadata: free-form JSON-ready notes (how costs were obtained, versions).

    Raises:
        InvalidGraphError: a duplicate op, an edge to an unknown op or output, or a cycle.

    Example:
        >>> graph = OpGraph(
        ...     [Op("a", cost={"CPU": 1.0}, output_bytes=[(0, 4)]), Op("b", cost={"CPU": 2.0})],
        ...     [Edge("a", "b", 0)], batch_size=8)
        >>> graph.topological_order(), graph.edge_bytes(graph.edges[0])
        (['a', 'b'], 32.0)
    """

    def __init__(
        self,
        ops: Iterable[Op],
        edges: Iterable[Edge | Sequence],
        *,
        batch_size: int = 1,
        name: str = "",
        metadata: Mapping[str, Any] | None = None,
    ):
        ops = tuple(ops)
        for op in ops:
            if not isinstance(op, Op):
                raise InvalidGraphError(f"OpGraph takes Op objects; received {op!r}.")
        seen: set[str] = set()
        for op in ops:
            if op.name in seen:
                raise InvalidGraphError(f"op {op.name!r} appears twice; op names must be unique.")
            seen.add(op.name)
        by_name = {op.name: op for op in ops}
        checked = []
        for raw in edges:
            edge = _as_edge(raw)
            for end in (edge.src, edge.dst):
                if end not in by_name:
                    raise InvalidGraphError(
                        f"edge {edge.src!r} -> {edge.dst!r} names unknown op {end!r}; "
                        "every edge must join two ops of the graph."
                    )
            if edge.output is not None and not 0 <= edge.output < len(by_name[edge.src].output_bytes):
                raise InvalidGraphError(
                    f"edge {edge.src!r} -> {edge.dst!r} reads output {_jsonio.shown(edge.output)} but op "
                    f"{edge.src!r} has {len(by_name[edge.src].output_bytes)} output(s); "
                    "use output=None for a control edge."
                )
            if edge.src == edge.dst:
                raise InvalidGraphError(f"edge {edge.src!r} -> {edge.dst!r} is a self-loop.")
            checked.append(edge)
        _jsonio.check_number(batch_size, "batch_size", InvalidGraphError, kind="count",
                             fix="give the batch the costs were measured at")
        self._ops = ops
        self._edges = tuple(checked)
        self._by_name = by_name
        self._batch_size = batch_size
        self._name = str(name)
        self._metadata = dict(metadata or {})
        try:
            self._structure = _Structure(ops, self._edges)
        except _CycleFound as cycle:
            names = [ops[i].name for i in cycle.stuck[:5]]
            raise InvalidGraphError(
                f"The graph has a cycle through {len(cycle.stuck)} op(s), e.g. {names}; "
                "a training step must be a DAG. Remove the back edge."
            ) from None

    def __reduce__(self):
        # Pickled as what it was built from (a graph sent to the planning process): the caches
        # of its structure, which can outweigh the graph, are rebuilt where they are needed.
        return _graph_from_parts, (self._ops, self._edges, self._batch_size, self._name, self._metadata)

    # ------------------------------------------------------------------ accessors
    @property
    def ops(self) -> tuple[Op, ...]:
        """All ops, in the order given."""
        return self._ops

    @property
    def edges(self) -> tuple[Edge, ...]:
        """All edges, in the order given."""
        return self._edges

    @property
    def batch_size(self) -> int:
        """The batch the costs were measured at."""
        return self._batch_size

    @property
    def name(self) -> str:
        """The graph's label."""
        return self._name

    @property
    def metadata(self) -> dict:
        """A copy of the free-form notes."""
        return dict(self._metadata)

    def __len__(self) -> int:
        return len(self._ops)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __repr__(self) -> str:
        return (f"OpGraph(name={self._name!r}, ops={len(self._ops)}, edges={len(self._edges)}, "
                f"batch_size={self._batch_size})")

    def op(self, name: str) -> Op:
        """The op called ``name``.

        Raises:
            InvalidGraphError: no such op.
        """
        try:
            return self._by_name[name]
        except KeyError:
            raise InvalidGraphError(f"The graph has no op named {name!r}.") from None

    def index(self, name: str) -> int:
        """Position of op ``name`` in ``ops``."""
        self.op(name)
        return self._structure.index[name]

    def predecessors(self, name: str) -> list[str]:
        """Names of the ops ``name`` depends on directly."""
        preds = self._structure.preds[self.index(name)]
        return [self._ops[i].name for i in preds]

    def successors(self, name: str) -> list[str]:
        """Names of the ops that depend on ``name`` directly."""
        succs = self._structure.succs[self.index(name)]
        return [self._ops[i].name for i in succs]

    def topological_order(self) -> list[str]:
        """Op names with every producer before its consumers (deterministic)."""
        return [self._ops[i].name for i in self._structure.topo]

    def layers(self) -> dict[str, list[str]]:
        """Layer path -> names of its ops, in op order (ops without a layer are left out)."""
        layers: dict[str, list[str]] = {}
        for op in self._ops:
            if op.layer is not None:
                layers.setdefault(op.layer, []).append(op.name)
        return layers

    def device_kinds(self) -> list[str]:
        """Device kinds every op has a cost for."""
        kinds = None
        for op in self._ops:
            kinds = set(op.cost) if kinds is None else kinds & set(op.cost)
        return sorted(kinds or ())

    def edge_bytes(self, edge: Edge, batch: float | None = None) -> float:
        """Bytes the edge moves at ``batch`` (default: the graph's batch); 0 for control."""
        if edge.output is None:
            return 0.0
        batch = self._batch_size if batch is None else batch
        return self._by_name[edge.src].output_bytes[edge.output].at(batch)

    def total_work(self, kind: str, batch: float | None = None) -> float:
        """Seconds of compute in one step on one device of ``kind`` (sum of all op costs)."""
        batch = self._batch_size if batch is None else batch
        return math.fsum(op.duration(kind, batch) for op in self._ops)

    def critical_path(self, kind: str, batch: float | None = None) -> tuple[float, list[str]]:
        """The longest chain of op costs on ``kind``, ignoring transfers.

        Returns:
            ``(seconds, op names along the path)``.

        Example:
            >>> graph = OpGraph([Op("a", cost={"CPU": 1.0}), Op("b", cost={"CPU": 2.0}),
            ...                  Op("c", cost={"CPU": 1.5})], [("a", "b", None), ("a", "c", None)])
            >>> graph.critical_path("CPU")
            (3.0, ['a', 'b'])
        """
        batch = self._batch_size if batch is None else batch
        s = self._structure
        n = len(self._ops)
        if n == 0:
            return 0.0, []
        finish = [0.0] * n
        best_pred = [-1] * n
        for i in s.topo:
            start = 0.0
            for p in s.preds[i]:
                if finish[p] > start:
                    start, best_pred[i] = finish[p], p
            finish[i] = start + self._ops[i].duration(kind, batch)
        end = max(range(n), key=lambda i: (finish[i], -i))
        path = []
        while end >= 0:
            path.append(self._ops[end].name)
            end = best_pred[end]
        return finish[self._structure.index[path[0]]], path[::-1]

    def fingerprint(self) -> str:
        """A stable hash of the structure (ops, types, layers, phases, edges), not the costs or order.

        Two profiles of the same model at different speeds share a fingerprint, so a
        plan can be checked against the model it is applied to.
        """
        cached = self._structure.cache.get("fingerprint")
        if cached is not None:
            return cached
        # Sorted, so two traces that list the same ops in another order agree.
        h = hashlib.sha256()
        for record in sorted(json.dumps([op.name, op.type, op.layer, op.phase, op.colocation,
                                         op.batch_axis, len(op.output_bytes)]) for op in self._ops):
            h.update(record.encode())
        for record in sorted(json.dumps(list(edge)) for edge in self._edges):
            h.update(record.encode())
        self._structure.cache["fingerprint"] = h.hexdigest()[:16]
        return self._structure.cache["fingerprint"]

    def with_ops(self, ops: Iterable[Op]) -> "OpGraph":
        """A new graph with the same edges and some ops replaced (matched by name)."""
        replaced = {op.name: op for op in ops}
        return OpGraph([replaced.get(op.name, op) for op in self._ops], self._edges,
                       batch_size=self._batch_size, name=self._name, metadata=self._metadata)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        """The graph as JSON-ready data."""
        return {
            "format_version": GRAPH_FORMAT_VERSION,
            "kind": _GRAPH_KIND,
            "name": self._name,
            "batch_size": self._batch_size,
            "metadata": self._metadata,
            "ops": [op.to_dict() for op in self._ops],
            "edges": [list(edge) for edge in self._edges],
        }

    @classmethod
    def from_dict(cls, data: Any) -> "OpGraph":
        """Builds a graph from ``to_dict`` data, validating everything.

        Raises:
            InvalidGraphError: the data does not describe a valid graph.
            FileFormatError: wrong kind or version.
        """
        _jsonio.check_header(data, _GRAPH_KIND, GRAPH_FORMAT_VERSION)
        _jsonio.check_fields(data, {"ops", "edges", "batch_size", "name", "metadata"}, "profile")
        for field in ("ops", "edges"):
            if not isinstance(data.get(field), list):
                raise InvalidGraphError(f"field {field!r} must be a list.")
        if not data["ops"]:
            raise InvalidGraphError("field 'ops' is empty: a training step has at least one op. "
                                    "Re-profile the model.")
        for field, kind in (("name", str), ("metadata", Mapping)):
            if field in data and not isinstance(data[field], kind):
                raise InvalidGraphError(f"field {field!r} must be a {'string' if kind is str else 'JSON object'}; "
                                        f"received {data[field]!r:.80}.")
        ops = [Op.from_dict(op) for op in data["ops"]]
        return cls(ops, data["edges"], batch_size=data.get("batch_size", 1),
                   name=data.get("name", ""), metadata=data.get("metadata") or {})

    def save(self, path) -> None:
        """Writes the graph as JSON to ``path`` (gzip-compressed when it ends in ``.gz``)."""
        _jsonio.save(self.to_dict(), path, what="profile (OpGraph)")

    @classmethod
    def load(cls, path) -> "OpGraph":
        """Reads and validates a graph (a profile) written by ``save`` (``.json`` or ``.json.gz``).

        Raises:
            FileFormatError: unreadable, not JSON, of another kind or version, or
                invalid; the message names the file, the op and the field.
        """
        return _jsonio.load(path, cls.from_dict, what="profile (OpGraph)")


def _as_edge(raw: Any) -> Edge:
    if isinstance(raw, Edge):
        return raw
    if isinstance(raw, Mapping):
        raw = (raw.get("src"), raw.get("dst"), raw.get("output", 0))
    if isinstance(raw, (list, tuple)) and len(raw) in (2, 3):
        src, dst = raw[0], raw[1]
        output = raw[2] if len(raw) == 3 else 0
        if isinstance(src, str) and isinstance(dst, str) and (
            output is None or (isinstance(output, int) and not isinstance(output, bool))
        ):
            return Edge(src, dst, output)
    raise InvalidGraphError(
        f"An edge must be [src, dst, output] with op names and an output index "
        f"(null for control); received {raw!r}."
    )


def _graph_from_parts(ops, edges, batch_size, name, metadata) -> OpGraph:
    return OpGraph(ops, edges, batch_size=batch_size, name=name, metadata=metadata)
