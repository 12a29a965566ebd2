"""``SharedCompute``: devices that draw on one pool of compute, and how the tasks running on it share it.

A cluster's devices are independent unless it says otherwise. Logical CPUs are not: they are
labels on one host whose cores every op spreads over (TensorFlow's intra-op threads), and whose
ops run on one pool of inter-op threads. Measured (``benchmarks/logical_cpus.py``, figures in
docs/planner.md): four independent matmul chains spread over four logical CPUs take as long as
all four on ``/CPU:0``, and an op's kernel time grows with the number of ops running beside it.
So the simulator runs the tasks of such devices as a shared pool with ``lanes`` lanes: while
``k`` of its tasks run, each progresses at ``min(1, lanes / k)`` of its speed alone, and at
most ``threads`` run at once. With TensorFlow's default threading an op spreads over every
core, so one lane; with one intra-op thread per op, as many lanes as cores. A task's cost is
its time alone on the pool, which is what the profiler derives from a profiled step
(``kerasflow.profiling.xplane``). Logical GPUs carved from one GPU share its SMs the same way
(one lane).

The executor's own work around each op (scheduling, allocation: the gap between a profiled
step's wall time and its kernels, which the profiler spreads over the ops that run) is priced as
part of the op, on the pool: with it the default placement replays its measured step. Priced
instead as a delay that takes no core, it made the default placement faster than measured
(docs/planner.md gives the figure).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

from .. import _jsonio
from ..errors import InvalidClusterError

__all__ = ["SharedCompute"]


@dataclasses.dataclass(frozen=True)
class SharedCompute:
    """Devices that share one pool of compute (see the module docstring).

    Args:
        devices: the names of the devices that share it (two or more).
        threads: at most this many tasks of these devices run at once (TensorFlow's inter-op
            threads on a CPU host). A device with a per-device order runs one task at a time
            (its ops are chained); a device without one runs up to ``threads`` at once.
        lanes: how many tasks run at full speed side by side: the host's cores over the
            cores one op uses (its intra-op threads); 1 where every op spreads over the whole pool.

    Raises:
        InvalidClusterError: fewer than two devices, a device named twice, ``threads < 1`` or
            ``lanes < 1``.

    Example:
        >>> pool = SharedCompute(("/CPU:0", "/CPU:1"), threads=2)
        >>> pool.rate(running=4)  # each of 4 tasks on one lane
        0.25
        >>> SharedCompute.from_dict(pool.to_dict()) == pool
        True
    """

    devices: tuple[str, ...]
    threads: int
    lanes: int = 1

    def __post_init__(self):
        devices = self.devices
        if isinstance(devices, str) or not isinstance(devices, Iterable):
            raise InvalidClusterError(f"SharedCompute needs the names of the devices that share compute. "
                                      f"Received: devices={devices!r}")
        devices = tuple(devices)
        if len(devices) < 2 or len(set(devices)) != len(devices) or not all(isinstance(d, str) for d in devices):
            raise InvalidClusterError(f"SharedCompute needs two or more distinct device names. "
                                      f"Received: devices={list(devices)!r}")
        object.__setattr__(self, "devices", devices)
        threads = _jsonio.check_number(self.threads, "threads", InvalidClusterError, kind="count",
                                       where="shared compute: ", fix="give the inter-op threads (1 or more)")
        object.__setattr__(self, "threads", int(threads))
        lanes = _jsonio.check_number(self.lanes, "lanes", InvalidClusterError, kind="count",
                                     where="shared compute: ", fix="give the tasks that run at full speed (1 or more)")
        object.__setattr__(self, "lanes", int(lanes))

    def rate(self, running: int) -> float:
        """Each task's speed, as a fraction of its speed alone, while ``running`` tasks run."""
        return min(1.0, self.lanes / running) if running > 0 else 1.0

    def to_dict(self) -> dict:
        """JSON-ready data."""
        return {"devices": list(self.devices), "threads": self.threads, "lanes": self.lanes}

    @classmethod
    def from_dict(cls, data: Any) -> "SharedCompute":
        """Reads ``to_dict`` data, validating it."""
        if not isinstance(data, Mapping) or not {"devices", "threads"} <= set(data) <= {"devices", "threads", "lanes"}:
            raise InvalidClusterError(f"Each entry of 'shared' needs 'devices' and 'threads' (and may give "
                                      f"'lanes'). Received: {data!r}")
        devices = data["devices"]
        return cls(tuple(devices) if isinstance(devices, list) else devices, data["threads"], data.get("lanes", 1))
