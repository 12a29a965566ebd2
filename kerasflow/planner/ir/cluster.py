"""``Cluster``: the devices a plan may use and the links between them, with cited presets."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable, Mapping, NamedTuple

from .. import _jsonio
from ..errors import InvalidClusterError
from .hardware import DEVICE_SPECS, GB
from .machine import SharedCompute

__all__ = ["Device", "Link", "Cluster", "CLUSTER_FORMAT_VERSION"]

CLUSTER_FORMAT_VERSION = 1
_CLUSTER_KIND = "kerasflow.Cluster"
# Logical CPUs of one machine: a planner's devices, not a fleet (and a bound on memory use).
MAX_TESTBED_DEVICES = 1024


def _figure(value: Any, field: str, where: str, kind: str) -> float:
    return float(_jsonio.check_number(value, field, InvalidClusterError, where=where, kind=kind,
                                      fix="fix the cluster's figures"))


@dataclasses.dataclass(frozen=True)
class Device:
    """One device a plan can put ops on.

    Args:
        name: the TensorFlow device string (``"/GPU:0"``,
            ``"/job:worker/replica:0/task:1/device:GPU:3"``).
        kind: the device kind op costs are keyed by (``"V100"``, ``"CPU"``).
        memory: bytes of device memory.
        speed: relative speed within its kind (an op's cost for the kind is divided by it).
        host: which machine the device sits in (for multi-host clusters).
        memory_bandwidth: bytes/s of device memory, used to price split and concat copies;
            defaults to the kind's datasheet figure.
        launch_overhead: seconds any kernel costs; defaults to the kind's figure.

    Example:
        >>> Device("/GPU:0", "V100", memory=16 * 2**30).memory_bandwidth
        900000000000.0
    """

    name: str
    kind: str
    memory: int
    speed: float = 1.0
    host: int = 0
    memory_bandwidth: float = 0.0
    launch_overhead: float = -1.0

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise InvalidClusterError(f"A device needs a non-empty name; received {self.name!r}.")
        if not isinstance(self.kind, str) or not self.kind:
            raise InvalidClusterError(f"device {self.name!r}: 'kind' must be a non-empty string.")
        where = f"device {self.name!r}: "
        object.__setattr__(self, "memory", int(_figure(self.memory, "memory", where, "positive")))
        object.__setattr__(self, "speed", _figure(self.speed, "speed", where, "factor"))
        if isinstance(self.host, bool) or not isinstance(self.host, int) or self.host < 0:
            raise InvalidClusterError(f"device {self.name!r}: 'host' must be an integer >= 0.")
        spec = DEVICE_SPECS.get(self.kind)
        if not self.memory_bandwidth:
            object.__setattr__(self, "memory_bandwidth", spec.memory_bandwidth if spec else 100 * GB)
        _figure(self.memory_bandwidth, "memory_bandwidth", where, "divisor")
        if self.launch_overhead < 0:
            object.__setattr__(self, "launch_overhead", spec.launch_overhead if spec else 5e-6)
        _figure(self.launch_overhead, "launch_overhead", where, "non-negative")

    def copy_seconds(self, read_bytes: float, write_bytes: float) -> float:
        """Seconds a local copy kernel takes to read ``read_bytes`` and write ``write_bytes``
        (a split, concat or gradient sum), its launch included.

        Example:
            >>> Device("/GPU:0", "V100", 2**34, memory_bandwidth=1e9, launch_overhead=1e-5).copy_seconds(1e6, 1e6)
            0.00201
        """
        return self.launch_overhead + (read_bytes + write_bytes) / self.memory_bandwidth


class Link(NamedTuple):
    """A directed link: a transfer of ``b`` bytes takes ``latency + b / bandwidth`` seconds.

    Example:
        >>> Link(latency=1e-5, bandwidth=12e9).seconds(12e6)
        0.00101
    """

    latency: float
    bandwidth: float

    def seconds(self, nbytes: float) -> float:
        """Transfer time of ``nbytes``."""
        return self.latency + nbytes / self.bandwidth


def _check_link(link: Any, what: str) -> Link:
    if isinstance(link, Mapping):
        link = (link.get("latency"), link.get("bandwidth"))
    if not isinstance(link, (tuple, list)) or len(link) != 2:
        raise InvalidClusterError(f"{what} must be (latency seconds, bandwidth bytes/s); received {link!r}.")
    return Link(_figure(link[0], "latency", f"{what}: ", "non-negative"),
                _figure(link[1], "bandwidth", f"{what}: ", "divisor"))


# Link figures used by the presets (one direction):
# - PCIe 3.0 x16: 15.75 GB/s theoretical, ~12 GB/s achieved by cudaMemcpy peer copies;
#   ~10 us per copy (launch + DMA setup).
# - PCIe 4.0 x16 (A100 servers' host link): 31.5 GB/s and PCIe 5.0 x16 (H100's): 63 GB/s
#   theoretical (PCI-SIG), taken at PCIe 3's achieved share of its line rate (76 %): 24 and
#   48 GB/s, with PCIe 3's 10 us per copy.
# - NVLink 2 (V100): 25 GB/s per link per direction (NVIDIA V100 whitepaper); ~5 us.
# - NVLink 3 through NVSwitch (DGX A100): 300 GB/s per GPU per direction; ~3 us.
# - NVLink 4 through NVSwitch (DGX H100): 450 GB/s per GPU per direction; ~3 us.
# - 100 Gb/s Ethernet between hosts: 12.5 GB/s line rate; ~25 us through the TCP stack.
# - Logical CPUs of one process pass tensors by reference; the cost is TF's send/receive
#   rendezvous, ~20 us, and a nominal 50 GB/s.
PCIE3 = Link(10e-6, 12 * GB)
PCIE4 = Link(10e-6, 24 * GB)
PCIE5 = Link(10e-6, 48 * GB)
NVLINK2 = Link(5e-6, 25 * GB)
NVSWITCH3 = Link(3e-6, 300 * GB)
NVSWITCH4 = Link(3e-6, 450 * GB)
ETHERNET_100G = Link(25e-6, 12.5 * GB)
SAME_PROCESS = Link(20e-6, 50 * GB)


class Cluster:
    """Devices and the links between them.

    Args:
        devices: the devices, names unique.
        default_link: the link between any two devices not listed in ``links``.
        links: per ordered pair ``(src name, dst name)``, a ``Link`` overriding the default.
        name: a label (presets use their preset name).
        shared: groups of devices that draw on one pool of compute (``SharedCompute``: logical
            CPUs of one host); a device is in at most one. Others are independent.
        step_dispatch: seconds a step pays once when it runs ops on a host other than the first
            device's: TensorFlow's runtime hands each other task its part of the step, and
            gathers what it returns, by a remote call per step (measured on ``kerasflow.testbed``:
            about 1 ms over loopback). 0 (the default): nothing.
        message_gap: seconds a transfer between two hosts holds its link beyond its bytes (the
            sender's and receiver's handling of one message). Its latency beyond that overlaps
            the transfers that follow: gRPC keeps several in flight (over loopback, 16 transfers
            of a few bytes took about 60 us each in flight, 200 us each one after another). None
            (the default): a transfer holds its link for its whole latency.
        core_share: the fraction of the time a transfer between two hosts holds its link that
            the sending and the receiving device each spend on it, not computing: their own
            cores copy the bytes through the network stack (CPU tasks over TCP: on
            ``kerasflow.testbed`` a matmul chain on a task took about the time of a 16 MiB
            transfer longer while the task sent or received it, so 1 there). 0 (the default):
            devices compute while their links carry (GPUs' copy engines, NICs).
        host: the CPU of the first device's machine where the devices are accelerators: no plan
            puts the step's compute on it, but the ops only a host can run (``Op.host_only``:
            string ops, lookup tables) run there whatever a plan says, as TensorFlow's soft
            placement runs them, and their outputs cross ``host_link`` (``hosted``). None (CPU
            clusters, whose devices are hosts' CPUs): those ops are placed as any other.
        host_link: the link between ``host`` and each device, both ways (PCIe 3 by default).

    Raises:
        InvalidClusterError: duplicate or unknown devices, or bad figures.

    Example:
        >>> cluster = Cluster([Device("/GPU:0", "V100", 16 * 2**30),
        ...                    Device("/GPU:1", "V100", 16 * 2**30)],
        ...                   default_link=Link(5e-6, 25e9))
        >>> cluster.transfer_time("/GPU:0", "/GPU:1", 25e6)
        0.001005
    """

    def __init__(
        self,
        devices: Iterable[Device],
        default_link: Link | tuple = PCIE3,
        links: Mapping[tuple[str, str], Link | tuple] | None = None,
        *,
        name: str = "",
        shared: Iterable[SharedCompute] = (),
        step_dispatch: float = 0.0,
        message_gap: float | None = None,
        core_share: float = 0.0,
        host: Device | None = None,
        host_link: Link | tuple = PCIE3,
    ):
        self._devices = tuple(devices)
        if not self._devices:
            raise InvalidClusterError("A cluster needs at least one device.")
        for device in self._devices:
            if not isinstance(device, Device):
                raise InvalidClusterError(f"Cluster takes Device objects; received {device!r}.")
        self._index: dict[str, int] = {}
        for i, device in enumerate(self._devices):
            if device.name in self._index:
                raise InvalidClusterError(f"device {device.name!r} appears twice in the cluster.")
            self._index[device.name] = i
        self._default = _check_link(default_link, "default_link")
        self._links: dict[tuple[str, str], Link] = {}
        for pair, link in (links or {}).items():
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise InvalidClusterError(f"A link is keyed by (src, dst); received {pair!r}.")
            for end in pair:
                self.device(end)
            if pair[0] == pair[1]:
                raise InvalidClusterError(f"A link joins two different devices; received {pair!r}.")
            self._links[pair] = _check_link(link, f"link {pair[0]} -> {pair[1]}")
        self._name = str(name)
        self._shared = self._check_shared(shared)
        self._step_dispatch = _figure(step_dispatch, "step_dispatch", "cluster: ", "non-negative")
        self._message_gap = None if message_gap is None else _figure(message_gap, "message_gap", "cluster: ",
                                                                      "non-negative")
        self._core_share = _figure(core_share, "core_share", "cluster: ", "non-negative")
        if self._core_share > 1:
            raise InvalidClusterError(f"core_share is a fraction of a transfer's time, from 0 to 1. Received: "
                                      f"core_share={core_share!r}")
        if host is not None and (not isinstance(host, Device) or host.name in self._index):
            raise InvalidClusterError(f"A cluster's host is a Device apart from its devices (the CPU beside them). "
                                      f"Received: host={host!r}")
        self._host, self._host_link = host, _check_link(host_link, "host_link")
        self._hosted: Cluster | None = None  # made on first use (``hosted``, ``unhosted``)
        self._unhosted: Cluster | None = None
        n = len(self._devices)
        # Dense matrices for the simulator's inner loop: a transfer arrives after its link's
        # latency and holds the link for its gap (the whole latency, unless message_gap is less).
        self.latency_matrix = [[0.0] * n for _ in range(n)]
        self.gap_matrix = [[0.0] * n for _ in range(n)]
        # Per pair, the share of a transfer's time each end's core spends on it (between hosts).
        self.core_share_matrix = [[self._core_share if da.host != db.host and a != b else 0.0
                                   for b, db in enumerate(self._devices)] for a, da in enumerate(self._devices)]
        self.inverse_bandwidth_matrix = [[0.0] * n for _ in range(n)]
        for a, da in enumerate(self._devices):
            for b, db in enumerate(self._devices):
                if a != b:
                    link = self.link(da.name, db.name)
                    self.latency_matrix[a][b] = link.latency
                    between_hosts = self._message_gap is not None and da.host != db.host
                    self.gap_matrix[a][b] = min(link.latency, self._message_gap) if between_hosts else link.latency
                    self.inverse_bandwidth_matrix[a][b] = 1.0 / link.bandwidth

    @classmethod
    def two_level(cls, devices: Iterable[Device], intra_host: Link | tuple, inter_host: Link | tuple, *,
                  name: str = "", host: Device | None = None, host_link: Link | tuple = PCIE3) -> "Cluster":
        """A multi-host cluster: ``intra_host`` between devices of one host (``Device.host``),
        ``inter_host`` (the network) between devices of different hosts; ``host`` and
        ``host_link`` as for the class.

        Example:
            >>> devices = [Device(f"/job:worker/replica:0/task:{h}/device:GPU:{i}", "V100", 16 * 2**30, host=h)
            ...            for h in range(2) for i in range(2)]
            >>> c = Cluster.two_level(devices, NVLINK2, ETHERNET_100G)
            >>> c.link(devices[0].name, devices[1].name) == NVLINK2, c.link(devices[0].name, devices[2].name) == ETHERNET_100G
            (True, True)
        """
        devices = tuple(devices)
        inter_host = _check_link(inter_host, "inter_host")
        links = {(a.name, b.name): inter_host for a in devices for b in devices
                 if isinstance(a, Device) and isinstance(b, Device) and a.host != b.host}
        return cls(devices, intra_host, links, name=name, host=host, host_link=host_link)

    def hosts(self) -> dict[int, list[str]]:
        """Host index -> the names of its devices, in cluster order.

        Example:
            >>> Cluster.preset("2x8xV100").hosts()[1][0]
            '/job:worker/replica:0/task:1/device:GPU:0'
        """
        grouped: dict[int, list[str]] = {}
        for device in self._devices:
            grouped.setdefault(device.host, []).append(device.name)
        return grouped

    def _check_shared(self, shared: Iterable[SharedCompute]) -> tuple[SharedCompute, ...]:
        pools = tuple(shared)
        self.pool_of = [-1] * len(self._devices)  # per device, its pool's index (-1: its own compute)
        for p, pool in enumerate(pools):
            if not isinstance(pool, SharedCompute):
                raise InvalidClusterError(f"'shared' takes SharedCompute objects. Received: {pool!r}")
            for name in pool.devices:
                i = self.index(name)
                if self.pool_of[i] >= 0:
                    raise InvalidClusterError(f"device {name!r} is in two groups of shared compute; a device "
                                              "draws on one pool at most.")
                self.pool_of[i] = p
        return pools

    # ------------------------------------------------------------------ accessors
    @property
    def host(self) -> Device | None:
        """The CPU that runs the ops only a host can run (None: they run on the devices; see the class)."""
        return self._host

    @property
    def host_link(self) -> Link:
        """The link between ``host`` and each device."""
        return self._host_link

    @property
    def hosted(self) -> "Cluster":
        """The cluster the simulator runs a step on: its devices and, last, its ``host`` (joined to
        each by ``host_link``); itself when it has no host. Made once.

        Example:
            >>> cluster = Cluster.preset("2xK80-pcie")
            >>> cluster.hosted.device_names, cluster.hosted.link("/CPU:0", "/GPU:1") == PCIE3
            (['/GPU:0', '/GPU:1', '/CPU:0'], True)
        """
        if self._host is None:
            return self
        if self._hosted is None:
            links = dict(self._links)
            for device in self._devices:
                links[(self._host.name, device.name)] = links[(device.name, self._host.name)] = self._host_link
            self._hosted = self._like(devices=self._devices + (self._host,), links=links, host=None)
        return self._hosted

    @property
    def unhosted(self) -> "Cluster":
        """The same devices without a host (itself when it has none): host-only ops placed as any.
        Made once."""
        if self._host is None:
            return self
        if self._unhosted is None:
            self._unhosted = self._like(host=None)
        return self._unhosted

    def _like(self, **changes) -> "Cluster":
        """A cluster with this one's settings but ``changes`` (``Cluster``'s arguments)."""
        settings = dict(devices=self._devices, default_link=self._default, links=self._links, name=self._name,
                        shared=self._shared, step_dispatch=self._step_dispatch, message_gap=self._message_gap,
                        core_share=self._core_share, host=self._host, host_link=self._host_link)
        settings.update(changes)
        return Cluster(**settings)

    @property
    def shared(self) -> tuple[SharedCompute, ...]:
        """The groups of devices that share compute (empty: every device is independent)."""
        return self._shared

    def independent(self) -> "Cluster":
        """The same devices and links, each device taken as one of its own (no shared compute):
        logical CPUs as ``cpu-testbed`` models them.

        Example:
            >>> Cluster.preset("logical-cpus:2").independent().shared
            ()
        """
        return self._like(shared=())

    def sums_with_nccl(self, names: Iterable[str]) -> bool:
        """Whether kerasflow sums over the named devices with NCCL (``strategies.collectives``): all
        GPUs, no two carved from one card (NCCL refuses two ranks on one card); else TensorFlow's
        own ring reducer runs the sum.

        Example:
            >>> Cluster.preset("4xV100-nvlink").sums_with_nccl(["/GPU:0", "/GPU:1"])
            True
            >>> Cluster.preset("logical-cpus:2").sums_with_nccl(["/CPU:0", "/CPU:1"])
            False
        """
        names = list(names)
        return all("GPU" in n.upper().rsplit("/", 1)[-1] for n in names) and not self.shares_compute(names)

    def shares_compute(self, names: Iterable[str]) -> bool:
        """Whether two of the named devices draw on one pool of compute.

        Example:
            >>> Cluster.preset("logical-cpus:2").shares_compute(["/CPU:0", "/CPU:1"])
            True
        """
        pools = [self.pool_of[self.index(n)] for n in names]
        pooled = [p for p in pools if p >= 0]
        return len(pooled) != len(set(pooled))

    @property
    def devices(self) -> tuple[Device, ...]:
        """The devices, in order."""
        return self._devices

    @property
    def step_dispatch(self) -> float:
        """Seconds a step running ops on another host than the first device's pays once (see the class)."""
        return self._step_dispatch

    @property
    def message_gap(self) -> float | None:
        """Seconds a transfer between hosts holds its link beyond its bytes (None: its latency)."""
        return self._message_gap

    @property
    def core_share(self) -> float:
        """The share of a transfer between hosts each of its devices spends copying it (see the class)."""
        return self._core_share

    def dispatch_for(self, used: Iterable[int]) -> float:
        """The dispatch a step pays that runs ops on the devices of indices ``used``.

        Example:
            >>> devices = [Device(f"/job:worker/replica:0/task:{h}/device:CPU:0", "CPU", 2**30, host=h) for h in (0, 1)]
            >>> cluster = Cluster(devices, Link(2e-4, 1e9), step_dispatch=1e-3)
            >>> cluster.dispatch_for([0]), cluster.dispatch_for([0, 1])
            (0.0, 0.001)
        """
        if not self._step_dispatch:
            return 0.0
        first = self._devices[0].host
        return self._step_dispatch if any(self._devices[i].host != first for i in used) else 0.0

    @property
    def device_names(self) -> list[str]:
        """The device names, in order."""
        return [d.name for d in self._devices]

    @property
    def name(self) -> str:
        """The cluster's label."""
        return self._name

    @property
    def default_link(self) -> Link:
        """The link used for pairs without an override."""
        return self._default

    def __len__(self) -> int:
        return len(self._devices)

    def __repr__(self) -> str:
        return f"Cluster(name={self._name!r}, devices={self.device_names})"

    def device(self, name: str) -> Device:
        """The device called ``name``.

        Raises:
            InvalidClusterError: no such device; the message lists the known ones.
        """
        try:
            return self._devices[self._index[name]]
        except (KeyError, TypeError):
            raise InvalidClusterError(
                f"device {name!r} is not in the cluster; it has {self.device_names}."
            ) from None

    def index(self, name: str) -> int:
        """Position of device ``name``."""
        self.device(name)
        return self._index[name]

    def link(self, src: str, dst: str) -> Link:
        """The link from ``src`` to ``dst`` (the default unless overridden)."""
        self.device(src)
        self.device(dst)
        return self._links.get((src, dst), self._default)

    def transfer_time(self, src: str, dst: str, nbytes: float) -> float:
        """Seconds to move ``nbytes`` from ``src`` to ``dst`` (0 on the same device)."""
        if src == dst:
            return 0.0
        return self.link(src, dst).seconds(nbytes)

    def slowest_link(self) -> Link:
        """The link with the lowest bandwidth among all device pairs (ties: highest latency)."""
        if len(self._devices) < 2:
            return self._default
        links = [self.link(a.name, b.name) for a in self._devices for b in self._devices if a is not b]
        return min(links, key=lambda link: (link.bandwidth, -link.latency))

    def kinds(self) -> list[str]:
        """Distinct device kinds, in device order."""
        return list(dict.fromkeys(d.kind for d in self._devices))

    def subset(self, names: Iterable[str]) -> "Cluster":
        """A cluster of only the named devices, links kept."""
        names = list(names)
        devices = [self.device(n) for n in names]
        links = {p: l for p, l in self._links.items() if p[0] in names and p[1] in names}
        shared = []
        for pool in self._shared:
            kept = tuple(d for d in pool.devices if d in names)
            if len(kept) > 1:
                shared.append(dataclasses.replace(pool, devices=kept))
        return self._like(devices=devices, links=links, name=f"{self._name}[{len(names)}]", shared=shared)

    # ------------------------------------------------------------------ presets
    @staticmethod
    def presets() -> list[str]:
        """Names accepted by ``Cluster.preset`` (``cpu-testbed:N`` and ``logical-cpus:N`` take
        1 <= N <= ``MAX_TESTBED_DEVICES``)."""
        return list(_PRESETS) + ["cpu-testbed:N", "logical-cpus:N"]

    @classmethod
    def preset(cls, name: str) -> "Cluster":
        """A cluster with published figures.

        Args:
            name: one of ``Cluster.presets()``, e.g. ``"4xV100-nvlink"`` or ``"cpu-testbed:4"``.
                ``cpu-testbed:N`` is N logical CPUs taken for independent devices (one intra-op
                thread each, as ``benchmarks/cpu_testbed.py`` runs them); ``logical-cpus:N`` is N
                logical CPUs as TensorFlow runs them by default: one host's compute, shared
                (``SharedCompute``, N inter-op threads).

        Raises:
            InvalidClusterError: unknown name.

        Example:
            >>> Cluster.preset("2x8xV100").device_names[8]
            '/job:worker/replica:0/task:1/device:GPU:0'
        """
        match = re.fullmatch(r"(cpu-testbed|logical-cpus):(\d+)", str(name))
        if match:
            count = int(match.group(2))
            if not 1 <= count <= MAX_TESTBED_DEVICES:
                raise InvalidClusterError(f"{match.group(1)}:N needs 1 <= N <= {MAX_TESTBED_DEVICES}. "
                                          f"Received: {name!r}")
            devices = [Device(f"/CPU:{i}", "CPU", DEVICE_SPECS["CPU"].memory) for i in range(count)]
            shared = [SharedCompute(tuple(d.name for d in devices), count)] \
                if match.group(1) == "logical-cpus" and count > 1 else []
            return cls(devices, SAME_PROCESS, name=name, shared=shared)
        if name not in _PRESETS:
            raise InvalidClusterError(
                f"Unknown cluster preset {name!r}; known presets: {cls.presets()}. "
                "Run `kerasflow clusters` to see their figures, or load a Cluster JSON file."
            )
        return _PRESETS[name]()

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        """The cluster as JSON-ready data."""
        return {
            "format_version": CLUSTER_FORMAT_VERSION,
            "kind": _CLUSTER_KIND,
            "name": self._name,
            "devices": [dataclasses.asdict(d) for d in self._devices],
            "default_link": self._default._asdict(),
            "links": [{"src": s, "dst": d, **l._asdict()} for (s, d), l in self._links.items()],
            "shared": [pool.to_dict() for pool in self._shared],
            **({"step_dispatch": self._step_dispatch} if self._step_dispatch else {}),
            **({"message_gap": self._message_gap} if self._message_gap is not None else {}),
            **({"core_share": self._core_share} if self._core_share else {}),
            **({"host": dataclasses.asdict(self._host), "host_link": self._host_link._asdict()}
               if self._host is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: Any) -> "Cluster":
        """Builds a cluster from ``to_dict`` data, validating everything."""
        _jsonio.check_header(data, _CLUSTER_KIND, CLUSTER_FORMAT_VERSION)
        _jsonio.check_fields(data, {"name", "devices", "links", "default_link", "shared", "step_dispatch",
                                    "message_gap", "core_share", "host", "host_link"}, "cluster")
        devices_data = data.get("devices")
        if not isinstance(devices_data, list):
            raise InvalidClusterError("field 'devices' must be a list of device objects.")
        devices = [_device_from(item) for item in devices_data]
        host = _device_from(data["host"]) if data.get("host") is not None else None
        links = {}
        for item in data.get("links") or []:
            if not isinstance(item, Mapping) or "src" not in item or "dst" not in item:
                raise InvalidClusterError(f"Each link needs 'src' and 'dst'; received {item!r}.")
            links[(item["src"], item["dst"])] = item
        shared = data.get("shared") or []
        if not isinstance(shared, list):
            raise InvalidClusterError(f"field 'shared' must be a list of groups of devices. Received: {shared!r}")
        return cls(devices, data.get("default_link", PCIE3), links, name=data.get("name", ""),
                   shared=[SharedCompute.from_dict(item) for item in shared],
                   step_dispatch=data.get("step_dispatch", 0.0), message_gap=data.get("message_gap"),
                   core_share=data.get("core_share", 0.0), host=host, host_link=data.get("host_link", PCIE3))

    def save(self, path) -> None:
        """Writes the cluster as JSON."""
        _jsonio.save(self.to_dict(), path, what="cluster")

    @classmethod
    def load(cls, path) -> "Cluster":
        """Reads and validates a cluster written by ``save``."""
        return _jsonio.load(path, cls.from_dict, what="cluster")

    @classmethod
    def resolve(cls, spec: "Cluster | str") -> "Cluster":
        """A ``Cluster`` from itself, a preset name, or a path to a cluster file (``.json`` or ``.json.gz``)."""
        if isinstance(spec, Cluster):
            return spec
        if isinstance(spec, str) and (spec in _PRESETS or spec.startswith(("cpu-testbed:", "logical-cpus:"))):
            return cls.preset(spec)
        if isinstance(spec, str) and spec.endswith(_jsonio.SUFFIXES):
            return cls.load(spec)
        raise InvalidClusterError(
            f"Expected a Cluster, a preset name or a .json path (or .json.gz); received {spec!r}. "
            f"Presets: {cls.presets()}."
        )


def _device_from(item: Any) -> Device:
    """A ``Device`` from its JSON object, validated."""
    if not isinstance(item, Mapping) or not {"name", "kind", "memory"} <= set(item):
        raise InvalidClusterError(f"Each device needs 'name', 'kind' and 'memory'; received {item!r}.")
    unknown = sorted(set(item) - {f.name for f in dataclasses.fields(Device)})
    if unknown:
        raise InvalidClusterError(f"device {item.get('name')!r}: unknown field(s) {unknown}.")
    return Device(**item)


def _gpus(kind: str, count: int, link: Link, *, hosts: int = 1, name: str, host_link: Link = PCIE3) -> Cluster:
    spec = DEVICE_SPECS[kind]
    devices = []
    for host in range(hosts):
        for i in range(count):
            device = f"/GPU:{i}" if hosts == 1 else f"/job:worker/replica:0/task:{host}/device:GPU:{i}"
            devices.append(Device(device, kind, spec.memory, host=host))
    cpu = "/CPU:0" if hosts == 1 else "/job:worker/replica:0/task:0/device:CPU:0"  # the chief's
    return Cluster.two_level(devices, link, ETHERNET_100G, name=name,
                             host=Device(cpu, "CPU", DEVICE_SPECS["CPU"].memory), host_link=host_link)


_PRESETS = {
    "2xK80-pcie": lambda: _gpus("K80", 2, PCIE3, name="2xK80-pcie"),
    "4xV100-pcie": lambda: _gpus("V100", 4, PCIE3, name="4xV100-pcie"),
    "4xV100-nvlink": lambda: _gpus("V100", 4, NVLINK2, name="4xV100-nvlink"),
    "8xV100-nvlink": lambda: _gpus("V100", 8, NVLINK2, name="8xV100-nvlink"),
    "8xA100-nvlink": lambda: _gpus("A100", 8, NVSWITCH3, name="8xA100-nvlink", host_link=PCIE4),
    "8xH100-nvlink": lambda: _gpus("H100", 8, NVSWITCH4, name="8xH100-nvlink", host_link=PCIE5),
    "2x8xV100": lambda: _gpus("V100", 8, NVLINK2, hosts=2, name="2x8xV100"),
}
