"""``Plan``: where every op runs, in which order, how layers split and how waves run."""

from __future__ import annotations

import dataclasses
import math
from itertools import repeat
from typing import Any, Mapping, Sequence

from .. import _jsonio
from ..errors import InvalidPlanError, KerasflowError

__all__ = ["Shard", "Waves", "DataParallel", "Plan", "PLAN_FORMAT_VERSION", "WAVE_OFFSETS", "MAX_WAVES"]

PLAN_FORMAT_VERSION = 1
_PLAN_KIND = "kerasflow.Plan"
WAVE_OFFSETS = ("forward", "none")
# More micro-batches than any pipeline uses; a bound on simulation time and memory.
MAX_WAVES = 64


def _predicted(value: Any, field: str) -> None:
    _jsonio.check_number(value, field, InvalidPlanError, where="Plan ", kind="derived",
                         fix="seconds and bytes the simulator predicted: replan, or fix the file")


def _version() -> str:
    from ..._version import __version__

    return __version__


class _Frozen(dict):
    def _refuse(self, *args, **kwargs):
        raise TypeError("Plans are immutable; build a new one with dataclasses.replace().")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse  # type: ignore

    def __reduce__(self):  # pickled as a plain dict, made frozen again (a plan or graph sent to a process)
        return type(self), (dict(self),)


@dataclasses.dataclass(frozen=True)
class Shard:
    """One shard of a split layer: the fraction of the batch it takes and its device.

    Example:
        >>> Shard("/GPU:1", 0.25)
        Shard(device='/GPU:1', fraction=0.25)
    """

    device: str
    fraction: float


@dataclasses.dataclass(frozen=True)
class Waves:
    """Tick-Tock waves: the batch runs as ``count`` micro-batches with offset launches.

    Args:
        count: number of waves (micro-batches); 2 is Tick-Tock.
        offset: ``"forward"``: wave ``w`` starts its forward pass only when wave ``w-1``
            has finished its forward pass (Wavelet's half-cycle offset);
            ``"none"``: waves start together and interleave by priority (a pipeline).
        stage_maps: for each wave, a device -> device mapping applied to the plan's
            placement (the tock wave of Tick-Tock model parallelism reverses the stage
            order). Empty, or an empty mapping for a wave, means identity.
        fractions: each wave's share of the batch; equal shares when empty.

    The waves' gradients are summed before one optimizer update, so the result equals
    training on the whole batch.

    Example:
        >>> Waves(2, stage_maps=({}, {"/GPU:0": "/GPU:1", "/GPU:1": "/GPU:0"})).fraction(1)
        0.5
    """

    count: int = 2
    offset: str = "forward"
    stage_maps: tuple[Mapping[str, str], ...] = ()
    fractions: tuple[float, ...] = ()

    def __post_init__(self):
        if isinstance(self.count, bool) or not isinstance(self.count, int) or not 1 <= self.count <= MAX_WAVES:
            raise InvalidPlanError(f"waves.count must be an integer from 1 to {MAX_WAVES}; received {self.count!r}.")
        if self.offset not in WAVE_OFFSETS:
            raise InvalidPlanError(f"waves.offset must be one of {WAVE_OFFSETS}; received {self.offset!r}.")
        if any(not isinstance(m, Mapping) for m in self.stage_maps if m):
            raise InvalidPlanError(f"waves.stage_maps must be device -> device mappings; received "
                                   f"{list(self.stage_maps)!r:.120}.")
        maps = tuple(_Frozen(dict(m or {})) for m in self.stage_maps)
        if maps and len(maps) != self.count:
            raise InvalidPlanError(
                f"waves.stage_maps has {len(maps)} mappings for {self.count} waves; give one per wave.")
        for m in maps:
            if sorted(m) != sorted(m.values()):
                raise InvalidPlanError(
                    f"a wave's stage map must permute devices (each device once on each side); "
                    f"received {dict(m)!r}.")
        object.__setattr__(self, "stage_maps", maps)
        if any(isinstance(f, bool) or not isinstance(f, (int, float)) for f in self.fractions):
            raise InvalidPlanError(f"waves.fractions must be numbers; received {_jsonio.shown(list(self.fractions))}.")
        if self.fractions:
            if len(self.fractions) != self.count:
                raise InvalidPlanError(
                    f"waves.fractions has {len(self.fractions)} entries for {self.count} waves.")
            # Compared before float(), which an integer past float's range would overflow.
            if any(not 0 < f <= 1 for f in self.fractions) or not math.isclose(sum(self.fractions), 1.0, abs_tol=1e-6):
                raise InvalidPlanError(
                    f"waves.fractions must be positive and sum to 1; received {_jsonio.shown(list(self.fractions))}.")
        object.__setattr__(self, "fractions", tuple(float(f) for f in self.fractions))

    def fraction(self, wave: int) -> float:
        """The share of the batch wave ``wave`` takes."""
        return self.fractions[wave] if self.fractions else 1.0 / self.count

    def device(self, wave: int, device: str) -> str:
        """Where wave ``wave`` runs what the placement puts on ``device``."""
        if not self.stage_maps:
            return device
        return self.stage_maps[wave].get(device, device)


@dataclasses.dataclass(frozen=True)
class DataParallel:
    """Data parallelism: every device runs the whole step on an equal share of the batch.

    Gradients are summed by an all-reduce (at run time one TensorFlow collective per fused
    buffer; priced as the ring algorithm runs it, ``2(D-1)/D`` x gradient bytes over the
    slowest link) and every device keeps a replica of the weights.

    Args:
        devices: the replicas' devices.
        allreduce: how the all-reduce is priced (``"ring"``: the ring algorithm).
        synchronized: BatchNormalization in training normalizes with the whole batch's
            statistics, as one device does (each an all-reduce forward and backward);
            False: with each replica's own share's, as ``tf.distribute.MirroredStrategy`` does
            (a plan file without the field was made before kerasflow synchronized them).

    Example:
        >>> DataParallel(("/GPU:0", "/GPU:1")).devices
        ('/GPU:0', '/GPU:1')
    """

    devices: tuple[str, ...]
    allreduce: str = "ring"
    synchronized: bool = True

    def __post_init__(self):
        devices = tuple(self.devices)
        if not devices or len(set(devices)) != len(devices):
            raise InvalidPlanError(
                f"data_parallel.devices must list distinct devices; received {list(devices)}.")
        if self.allreduce != "ring":
            raise InvalidPlanError(f"Only the 'ring' all-reduce is modelled; received {self.allreduce!r}.")
        if not isinstance(self.synchronized, bool):
            raise InvalidPlanError(f"data_parallel.synchronized must be true or false; received {self.synchronized!r}.")
        object.__setattr__(self, "devices", devices)


@dataclasses.dataclass(frozen=True)
class Plan:
    """How one training step runs on a cluster.

    Args:
        placement: op name -> device name, for every op (empty with ``data_parallel``).
        order: device name -> task names in the order the device runs them. Task names
            are op names, suffixed for copies: ``@r<i>`` replica, ``@w<i>`` wave,
            ``@s<i>`` shard (e.g. ``"dense/MatMul@w1@s0"``). A device without an order
            runs ready tasks by priority.
        splits: layer -> shards; the layer's batch ops run as one copy per shard.
        waves: Tick-Tock waves, or None for one wave.
        data_parallel: data parallelism over these devices, or None.
        batch_size: the batch planned for; None means the graph's.
        predicted_step_time: seconds per step the simulator predicts for this plan.
        predicted_peak_memory: device -> bytes the simulator predicts.
        candidates: algorithm -> predicted step time of every candidate the planner tried.
        excluded: candidate -> why the planner left it out (it did not fit the devices'
            memory, did not apply to the graph, would hand a device a batch the model
            refused, or could not beat the fastest plan).
        graph_fingerprint: ``OpGraph.fingerprint()`` of the graph planned for.
        cluster: the cluster's name.
        algorithm: which algorithm made the plan.
        version: the kerasflow version that made it.

    Example:
        >>> from kerasflow.planner import Cluster, synthetic
        >>> graph = synthetic.chain_mlp(layers=2)
        >>> plan = Plan(placement={op.name: "/GPU:0" for op in graph.ops})
        >>> plan.validate(graph, Cluster.preset("2xK80-pcie"))
        >>> plan.devices()
        ['/GPU:0']
    """

    placement: Mapping[str, str] = dataclasses.field(default_factory=dict)
    order: Mapping[str, Sequence[str]] = dataclasses.field(default_factory=dict)
    splits: Mapping[str, Sequence[Shard]] = dataclasses.field(default_factory=dict)
    waves: Waves | None = None
    data_parallel: DataParallel | None = None
    batch_size: int | None = None
    predicted_step_time: float | None = None
    predicted_peak_memory: Mapping[str, float] = dataclasses.field(default_factory=dict)
    candidates: Mapping[str, float] = dataclasses.field(default_factory=dict)
    excluded: Mapping[str, str] = dataclasses.field(default_factory=dict)
    graph_fingerprint: str = ""
    cluster: str = ""
    algorithm: str = ""
    version: str = dataclasses.field(default_factory=_version)

    def __post_init__(self):
        for field in ("placement", "order", "splits", "predicted_peak_memory", "candidates", "excluded"):
            value = getattr(self, field)
            if not isinstance(value, Mapping):
                raise InvalidPlanError(f"Plan field {field!r} must be a mapping; received {value!r}.")
        # A placement or order frozen here was checked when it was (``dataclasses.replace``
        # passes them on): checking 100k ops again for every replaced figure costs seconds.
        if not isinstance(self.placement, _Frozen):
            bad = next(((op, device) for op, device in self.placement.items()
                        if not isinstance(op, str) or not isinstance(device, str)), None)
            if bad is not None:
                raise InvalidPlanError(f"placement[{bad[0]!r}] must name a device (a string); "
                                       f"received {bad[1]!r:.80}.")
            object.__setattr__(self, "placement", _Frozen(self.placement))
        if not isinstance(self.order, _Frozen):
            orders = {}
            for device, names in self.order.items():
                if isinstance(names, str) or not isinstance(names, Sequence) or not all(
                        map(isinstance, names, repeat(str))):
                    raise InvalidPlanError(f"order[{device!r}] must be a list of task names; received {names!r:.80}.")
                orders[device] = tuple(names)
            object.__setattr__(self, "order", _Frozen(orders))
        splits = {}
        for layer, shards in self.splits.items():
            if isinstance(shards, (str, Mapping)) or not isinstance(shards, Sequence):
                raise InvalidPlanError(f"splits[{layer!r}] must be a list of shards; received {shards!r:.80}.")
            built = []
            for shard in shards:
                if isinstance(shard, Mapping):
                    shard = Shard(shard.get("device"), shard.get("fraction"))
                elif isinstance(shard, (list, tuple)) and len(shard) == 2:
                    shard = Shard(*shard)
                if not isinstance(shard, Shard) or not isinstance(shard.device, str):
                    raise InvalidPlanError(f"splits[{layer!r}] holds {shard!r:.80}; expected Shard(device, fraction).")
                fraction = shard.fraction
                if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
                    raise InvalidPlanError(f"splits[{layer!r}]: every shard needs a fraction > 0 and <= 1; "
                                           f"received {_jsonio.shown(fraction)}.")
                built.append(Shard(shard.device, float(shard.fraction)))
            if len(built) < 2:
                raise InvalidPlanError(f"splits[{layer!r}] needs at least 2 shards; received {len(built)}.")
            if not math.isclose(sum(s.fraction for s in built), 1.0, abs_tol=1e-6):
                raise InvalidPlanError(
                    f"splits[{layer!r}]: shard fractions must sum to 1; received "
                    f"{[s.fraction for s in built]}.")
            splits[layer] = tuple(built)
        object.__setattr__(self, "splits", _Frozen(splits))
        for field in ("predicted_peak_memory", "candidates"):
            values = getattr(self, field)
            for key, value in values.items():
                if not isinstance(key, str):
                    raise InvalidPlanError(f"Plan field {field!r} must map names to numbers; received key {key!r:.80}.")
                _predicted(value, f"{field}[{key!r}]")
            object.__setattr__(self, field, _Frozen(values))
        bad = next(((name, why) for name, why in self.excluded.items()
                    if not isinstance(name, str) or not isinstance(why, str)), None)
        if bad is not None:
            raise InvalidPlanError(f"Plan field 'excluded' must map candidate names to reasons (text); received "
                                   f"{bad[0]!r:.80}: {bad[1]!r:.80}.")
        object.__setattr__(self, "excluded", _Frozen(self.excluded))
        if self.predicted_step_time is not None:
            _predicted(self.predicted_step_time, "predicted_step_time")
        if self.data_parallel is not None and (self.placement or self.splits):
            raise InvalidPlanError(
                "A data-parallel plan runs the whole graph on every device: leave placement and "
                "splits empty.")
        if self.batch_size is not None:
            _jsonio.check_number(self.batch_size, "batch_size", InvalidPlanError, where="Plan ", kind="count",
                                 fix="give the batch planned for, or null for the graph's")

    # ------------------------------------------------------------------ queries
    @property
    def placement_only(self) -> bool:
        """Whether the plan only places and orders ops: no split layer, no waves, no replicas.

        Such a plan adds no sum in another order: a step under it computes what the default
        placement computes, bit for bit. Every other plan cuts a batch into parts whose sums it
        adds up in another order than one device, so it rounds otherwise.

        Example:
            >>> Plan(placement={"dense/MatMul": "/CPU:1"}).placement_only
            True
            >>> Plan(data_parallel=DataParallel(devices=("/CPU:0", "/CPU:1"))).placement_only
            False
        """
        return not self.splits and self.waves is None and self.data_parallel is None

    @property
    def synchronizes_statistics(self) -> bool:
        """Whether the replicas normalize with the whole batch's BatchNormalization statistics: a
        synchronized data-parallel plan without waves (a wave's statistics are its own anyway)."""
        return (self.data_parallel is not None and self.data_parallel.synchronized
                and (self.waves is None or self.waves.count == 1))

    def devices(self) -> list[str]:
        """Devices the plan uses, in first-use order."""
        if self.data_parallel is not None:
            return list(self.data_parallel.devices)
        used = dict.fromkeys(self.placement.values())
        for shards in self.splits.values():
            used.update(dict.fromkeys(s.device for s in shards))
        if self.waves is not None:
            for m in self.waves.stage_maps:
                used.update(dict.fromkeys(m.values()))
        return list(used)

    def validate(self, graph, cluster) -> None:
        """Checks the plan against ``graph`` and ``cluster``.

        Checks every op is placed on a device of the cluster, colocation groups share a
        device, split layers exist and can be split, and each device's order lists
        exactly its tasks without contradicting a dependency.

        Raises:
            InvalidPlanError: the first problem found, naming the op, layer or device.
        """
        from ..sim.taskgraph import build_task_graph

        build_task_graph(graph, cluster, self)

    def summary(self, graph=None, cluster=None, print_fn=print) -> str:
        """Prints (and returns) a Keras-style summary: per device its layers, busy share and
        peak memory; split layers; waves; every candidate's predicted step time.

        Args:
            graph: the profiled graph, to name layers and simulate busy shares.
            cluster: the cluster, with ``graph``.
            print_fn: where the text goes (None: only returned).

        Example:
            >>> from kerasflow.planner import Cluster, baselines, synthetic
            >>> graph, cluster = synthetic.chain_mlp(layers=2), Cluster.preset("2xK80-pcie")
            >>> text = baselines.single_device(graph, cluster).summary(graph, cluster, print_fn=None)
            >>> "/GPU:0" in text and "100%" in text
            True
        """
        from ..sim.report import plan_summary

        text = plan_summary(self, graph, cluster)
        if print_fn is not None:
            print_fn(text)
        return text

    def with_devices(self, mapping: Mapping[str, str]) -> "Plan":
        """The same plan on other devices: every device named in ``mapping`` is renamed.

        For a plan made for one set of names and run on another of the same shape: a plan
        for the ``2x8xV100`` preset run on the hosts of your ``TF_CONFIG``, or a cross-host
        plan replayed on one host.

        Raises:
            InvalidPlanError: two devices renamed to one.

        Example:
            >>> plan = Plan(placement={"a": "/GPU:0", "b": "/GPU:1"})
            >>> plan.with_devices({"/GPU:1": "/job:worker/replica:0/task:1/device:GPU:0"}).placement["b"]
            '/job:worker/replica:0/task:1/device:GPU:0'
        """
        used = self.devices() + list(self.order) + list(self.predicted_peak_memory)
        renamed = [mapping.get(d, d) for d in dict.fromkeys(used)]
        if len(set(renamed)) != len(renamed):
            raise InvalidPlanError(f"with_devices would merge devices: {dict(mapping)!r} maps two of "
                                   f"{list(dict.fromkeys(used))} to one name; give each device its own.")
        rename = lambda d: mapping.get(d, d)  # noqa: E731
        waves = self.waves
        if waves is not None:
            waves = dataclasses.replace(waves, stage_maps=tuple(
                {rename(a): rename(b) for a, b in m.items()} for m in waves.stage_maps))
        data_parallel = self.data_parallel
        if data_parallel is not None:
            data_parallel = dataclasses.replace(data_parallel, devices=tuple(rename(d) for d in data_parallel.devices))
        return dataclasses.replace(
            self, placement={op: rename(d) for op, d in self.placement.items()},
            order={rename(d): names for d, names in self.order.items()},
            splits={layer: tuple(Shard(rename(s.device), s.fraction) for s in shards)
                    for layer, shards in self.splits.items()},
            waves=waves, data_parallel=data_parallel,
            predicted_peak_memory={rename(d): b for d, b in self.predicted_peak_memory.items()})

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        """The plan as JSON-ready data."""
        waves = None
        if self.waves is not None:
            waves = {"count": self.waves.count, "offset": self.waves.offset,
                     "stage_maps": [dict(m) for m in self.waves.stage_maps],
                     "fractions": list(self.waves.fractions)}
        dp = None
        if self.data_parallel is not None:
            dp = {"devices": list(self.data_parallel.devices), "allreduce": self.data_parallel.allreduce,
                  "synchronized": self.data_parallel.synchronized}
        return {
            "format_version": PLAN_FORMAT_VERSION,
            "kind": _PLAN_KIND,
            "placement": dict(self.placement),
            "order": {d: list(names) for d, names in self.order.items()},
            "splits": {layer: [dataclasses.asdict(s) for s in shards] for layer, shards in self.splits.items()},
            "waves": waves,
            "data_parallel": dp,
            "batch_size": self.batch_size,
            "predicted_step_time": self.predicted_step_time,
            "predicted_peak_memory": dict(self.predicted_peak_memory),
            "candidates": dict(self.candidates),
            "excluded": dict(self.excluded),
            "graph_fingerprint": self.graph_fingerprint,
            "cluster": self.cluster,
            "algorithm": self.algorithm,
            "version": self.version,
        }

    @classmethod
    def from_dict(cls, data: Any) -> "Plan":
        """Builds a plan from ``to_dict`` data."""
        _jsonio.check_header(data, _PLAN_KIND, PLAN_FORMAT_VERSION)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known - {"format_version", "kind"})
        if unknown:
            raise InvalidPlanError(f"unknown plan field(s) {unknown}; known fields are {sorted(known)}.")
        fields = {k: v for k, v in data.items() if k in known}
        try:
            if fields.get("waves") is not None:
                w = fields["waves"]
                fields["waves"] = Waves(w.get("count", 2), w.get("offset", "forward"),
                                        tuple(w.get("stage_maps") or ()), tuple(w.get("fractions") or ()))
            if fields.get("data_parallel") is not None:
                d = fields["data_parallel"]
                fields["data_parallel"] = DataParallel(tuple(d.get("devices") or ()), d.get("allreduce", "ring"),
                                                       d.get("synchronized", False))
            for key in ("placement", "order", "splits", "predicted_peak_memory", "candidates", "excluded"):
                if fields.get(key) is None:
                    fields.pop(key, None)
            return cls(**fields)
        except KerasflowError:
            raise
        except (TypeError, AttributeError) as error:
            raise InvalidPlanError(f"malformed plan data: {error}.") from None

    def save(self, path) -> None:
        """Writes the plan as JSON (same plan, byte-identical file)."""
        _jsonio.save(self.to_dict(), path, what="plan")

    @classmethod
    def load(cls, path) -> "Plan":
        """Reads a plan written by ``save``; ``validate`` it against your graph and cluster."""
        return _jsonio.load(path, cls.from_dict, what="plan")
