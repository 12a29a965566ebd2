"""Several machines on TensorFlow's distributed runtime: connect, list every task's devices, build the two-level cluster.

kerasflow builds no transport of its own. Each host runs a ``tf.distribute.Server``
(``python -m kerasflow.worker``); the chief connects with
``tf.config.experimental_connect_to_cluster``, after which the devices of every task are
TensorFlow devices with names such as ``/job:worker/replica:0/task:1/device:GPU:0``. A plan
places ops on them and TensorFlow's partitioner inserts the send/receive pairs between hosts.
``FastTStrategy(cluster_resolver=...)`` calls ``connect`` and ``multihost_cluster``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import warnings
from typing import Any, Sequence

from kerasflow.devices import device_type, normalize_device, task_of  # re-exported: device names live there
from kerasflow.planner.ir.cluster import SAME_PROCESS, Cluster, Device, Link
from kerasflow.planner.errors import ClusterConnectionError, KerasflowError

__all__ = ["parse_tf_config", "resolver_from_environment", "task_addresses", "other_tasks", "wait_for_tasks", "connect",
           "task_of", "run_within", "exposure_warning", "TaskWatch", "silent_tasks", "device_type", "multihost_cluster"]

DEFAULT_CONNECT_TIMEOUT = 30.0


def parse_tf_config(config: str | dict) -> dict:
    """``TF_CONFIG`` (its JSON text, or the parsed mapping), checked to name a ``cluster``.

    Raises:
        ClusterConnectionError: not valid JSON, or no ``cluster`` mapping jobs to addresses.

    Example:
        >>> parse_tf_config('{"cluster": {"worker": ["10.0.0.2:2222"]}}')["cluster"]
        {'worker': ['10.0.0.2:2222']}
    """
    raw = config
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except json.JSONDecodeError as error:
            raise ClusterConnectionError(
                f"TF_CONFIG is not valid JSON ({error}); received {raw[:200]!r}. Set it to "
                '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": 0}}.') from None
    if not isinstance(config, dict) or not isinstance(config.get("cluster"), dict) or not config["cluster"]:
        raise ClusterConnectionError(
            f"TF_CONFIG has no 'cluster' mapping of jobs to addresses; received {str(raw)[:200]!r}.")
    return config


def resolver_from_environment():
    """A ``TFConfigClusterResolver`` when ``TF_CONFIG`` names a cluster, else None.

    Raises:
        ClusterConnectionError: ``TF_CONFIG`` is set but is not valid JSON with a ``cluster``.

    Example:
        >>> os.environ.pop("TF_CONFIG", None) and None
        >>> resolver_from_environment() is None
        True
    """
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return None
    parse_tf_config(raw)
    import tensorflow as tf

    return tf.distribute.cluster_resolver.TFConfigClusterResolver()


def _local_task(resolver) -> tuple[str, int] | None:
    """The (job, index) this process is in the cluster spec, or None for a pure client."""
    spec = resolver.cluster_spec()
    job = getattr(resolver, "task_type", None)
    if job and job in spec.jobs:
        return job, int(getattr(resolver, "task_id", 0) or 0)
    return None


def task_addresses(resolver) -> list[tuple[str, int, str]]:
    """Every task of the resolver's cluster as ``(job, index, "host:port")``, in job order.

    Raises:
        ClusterConnectionError: the cluster spec is empty.
    """
    spec = resolver.cluster_spec()
    tasks = []
    for job in spec.jobs:
        for index in spec.task_indices(job):
            tasks.append((job, index, spec.task_address(job, index)))
    if not tasks:
        raise ClusterConnectionError(
            "The cluster resolver describes no tasks; received an empty cluster spec. Give it the jobs and "
            "their addresses (TF_CONFIG's 'cluster', or a tf.train.ClusterSpec).")
    return tasks


# The other tasks of the cluster this process connected to (``connect`` fills it).
_connected_tasks: list[tuple[str, int, str]] = []


def silent_tasks(seconds: float = 2.0) -> list[tuple[str, int, str]]:
    """The tasks of the connected cluster that do not answer as gRPC servers within ``seconds``
    (none before ``connect``), to name the one a failed call lost.

    Example:
        >>> silent_tasks()
        []
    """
    deadline = time.monotonic() + seconds
    return [task for task in _connected_tasks if _reachable(task[2], deadline) is not None]


def other_tasks(resolver) -> list[tuple[str, int, str]]:
    """``task_addresses`` without the task this process serves."""
    local = _local_task(resolver)
    return [(job, index, address) for job, index, address in task_addresses(resolver) if (job, index) != local]


# An HTTP/2 client's connection preface and an empty SETTINGS frame: a gRPC server (TensorFlow's)
# answers with a SETTINGS frame of its own. A task that accepts TCP but is stopped, hung, or not
# TensorFlow at all answers nothing, or something else.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_SETTINGS_FRAME_TYPE = 0x04


def _reachable(address: str, deadline: float) -> str | None:
    """None once ``address`` answers as a gRPC server before ``deadline``; else the last error."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        return f"the address {address!r} is not host:port"
    error = "no attempt"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return error
        try:
            with socket.create_connection((host, int(port)), timeout=min(left, 2.0)) as connection:
                error = _speaks_grpc(connection, deadline)
                if error is None:
                    return None
        except OSError as failure:
            error = str(failure) or type(failure).__name__
        time.sleep(min(0.2, max(deadline - time.monotonic(), 0)))


def _speaks_grpc(connection: socket.socket, deadline: float) -> str | None:
    """None when the peer answers the HTTP/2 preface with a SETTINGS frame before ``deadline``."""
    try:
        connection.settimeout(max(deadline - time.monotonic(), 0.01))
        connection.sendall(_HTTP2_PREFACE)
        header = b""
        while len(header) < 9:
            connection.settimeout(max(deadline - time.monotonic(), 0.01))
            chunk = connection.recv(9 - len(header))
            if not chunk:
                return "it accepted the connection, then closed it without answering as TensorFlow does"
            header += chunk
    except socket.timeout:
        return "it accepts connections but does not answer (a stopped or hung process, or not TensorFlow)"
    except OSError as failure:
        return str(failure) or type(failure).__name__
    if header[3] != _SETTINGS_FRAME_TYPE:
        return "it answered, but not as a TensorFlow (gRPC) server: is another program on that port?"
    return None


def wait_for_tasks(resolver, timeout: float = DEFAULT_CONNECT_TIMEOUT) -> None:
    """Waits until every other task of the cluster answers as a TensorFlow (gRPC) server, at most
    ``timeout`` seconds.

    TensorFlow itself retries an unreachable task for a long time, and waits forever on one
    that accepts connections but does not answer (a stopped process, another program on the
    port); this check gives up at the deadline and says which task, where, and what to check.

    Raises:
        ClusterConnectionError: a task did not answer in time.

    Example:
        >>> import tensorflow as tf  # doctest: +SKIP
        >>> spec = tf.train.ClusterSpec({"worker": ["127.0.0.1:1"]})  # doctest: +SKIP
        >>> wait_for_tasks(tf.distribute.cluster_resolver.SimpleClusterResolver(spec), 1)  # doctest: +SKIP
        Traceback (most recent call last):
        ClusterConnectionError: Task worker:0 at 127.0.0.1:1 did not answer within 1 s ...
    """
    deadline = time.monotonic() + timeout
    missing = []
    for job, index, address in other_tasks(resolver):
        error = _reachable(address, deadline)
        if error is not None:
            missing.append((job, index, address, error))
    if missing:
        listed = "; ".join(f"task {job}:{index} at {address} ({error})" for job, index, address, error in missing)
        raise ClusterConnectionError(
            f"{len(missing)} task(s) of the cluster did not answer within {timeout:g} s: {listed}. Check that "
            "`python -m kerasflow.worker` runs on each of those hosts with the same TF_CONFIG 'cluster' (and its "
            "own 'task'), that the host names resolve from here, and that a firewall lets this machine reach those "
            "ports; or raise connect_timeout.")


def connect(cluster_resolver=None, *, timeout: float = DEFAULT_CONNECT_TIMEOUT) -> list[str]:
    """Connects this process (the chief) to the cluster and returns the devices of every task.

    Args:
        cluster_resolver: a ``tf.distribute.cluster_resolver.ClusterResolver`` (default:
            ``TFConfigClusterResolver`` from ``TF_CONFIG``). When its ``task_type`` is a job of
            the cluster, this process serves that task; otherwise it joins as a client.
        timeout: seconds to wait for every other task to answer.

    Returns:
        Device names: this process's devices first (GPUs, else CPUs), then each task's, in
        the order of the cluster spec; remote ones in full
        (``/job:worker/replica:0/task:1/device:CPU:0``).

    Raises:
        ClusterConnectionError: no cluster given, or a task unreachable within ``timeout``.

    Example:
        >>> devices = kerasflow.multihost.connect(resolver, timeout=30)  # doctest: +SKIP
        >>> devices[:2]  # doctest: +SKIP
        ['/CPU:0', '/job:worker/replica:0/task:0/device:CPU:0']
    """
    resolver = cluster_resolver or resolver_from_environment()
    if resolver is None:
        raise ClusterConnectionError(
            "No cluster to connect to: pass cluster_resolver= (a tf.distribute.cluster_resolver.ClusterResolver) "
            "or set TF_CONFIG.")
    wait_for_tasks(resolver, timeout)
    import tensorflow as tf

    local = _local_task(resolver)
    job, index = local if local is not None else ("localhost", 0)

    def connect_and_list() -> list[str]:
        tf.config.experimental_connect_to_cluster(resolver.cluster_spec(), job_name=job, task_index=index,
                                                  protocol=getattr(resolver, "rpc_layer", None) or "grpc")
        return _cluster_devices(f"/job:{job}/replica:0/task:{index}")

    try:
        # TensorFlow's own calls have no deadline: a task that stops answering after the check
        # above would hang them, so they run in a thread this process stops waiting for.
        devices = run_within(connect_and_list, max(timeout, 1.0))
    except TimeoutError:
        raise ClusterConnectionError(
            f"TensorFlow did not finish connecting to the cluster {resolver.cluster_spec().as_dict()} within "
            f"{max(timeout, 1.0):g} s: a task answers but does not serve. Restart `python -m kerasflow.worker` on "
            "the tasks, or raise connect_timeout. (This process's TensorFlow context is now unusable: restart it.)"
        ) from None
    except (ValueError, RuntimeError, tf.errors.OpError) as error:
        raise ClusterConnectionError(
            f"TensorFlow could not connect to the cluster {resolver.cluster_spec().as_dict()} as {job}:{index}: "
            f"{str(error).splitlines()[0]}. Check that every task runs `python -m kerasflow.worker` with this "
            "TF_CONFIG, and connect before building any model.") from None
    _connected_tasks[:] = other_tasks(resolver)
    if local is not None:  # this process now serves its task too
        warnings.warn(f"kerasflow: {exposure_warning(resolver.cluster_spec().task_address(job, index))}",
                      RuntimeWarning, stacklevel=3)
    return devices


class TaskWatch:
    """Ends this process with one line saying why when TensorFlow waits on a task that is gone.

    TensorFlow's remote calls have no deadline: when a worker stops answering without closing
    its connections (stopped, or its host gone), the chief's next call waits for it forever.
    A daemon thread checks every other task every ``period`` seconds (it must answer as a gRPC
    server). When one has not answered for ``patience`` seconds while this process's main
    thread has stayed in one TensorFlow call all that time, the watch prints which task and
    what to do, and exits the process with ``EXIT_CODE``. A task gone while the main thread
    does anything else (training over, workers shut down) changes nothing.

    Args:
        tasks: the other tasks, as ``(job, index, "host:port")``.
        patience: seconds a task may stay silent during a stuck call (``connect_timeout``).
        period: seconds between checks (default: ``patience / 3``, at most 5).
        exit: what ends the process (``os._exit``; tests pass their own).

    Example:
        >>> watch = TaskWatch([("worker", 0, "10.0.0.2:2222")], patience=30).start()  # doctest: +SKIP
    """

    EXIT_CODE = 75  # EX_TEMPFAIL: restart the task, then resume from a checkpoint

    def __init__(self, tasks: Sequence[tuple[str, int, str]], patience: float, period: float | None = None,
                 exit: Any = os._exit):
        self.tasks, self.patience = list(tasks), float(patience)
        self.period = period if period is not None else min(5.0, self.patience / 3)
        self._exit = exit
        self._silent_since: dict[str, float] = {}
        self._call, self._call_since = None, 0.0
        self._main = threading.main_thread().ident

    def start(self) -> "TaskWatch":
        """Starts checking in a daemon thread (for the life of the process); returns the watch."""
        threading.Thread(target=self._run, name="kerasflow-task-watch", daemon=True).start()
        return self

    def _run(self) -> None:
        while True:
            time.sleep(self.period)
            self.check(time.monotonic())

    def check(self, now: float) -> str | None:
        """One round of checks; the message it exits with, or None."""
        stuck_since = self._main_call_since(now)
        stuck_for = now - stuck_since if stuck_since is not None else None
        for job, index, address in self.tasks:
            problem = _reachable(address, time.monotonic() + min(max(self.period, 0.5), 2.0))
            if problem is None:
                self._silent_since.pop(address, None)
                continue
            silent_for = now - self._silent_since.setdefault(address, now)
            if stuck_for is not None and silent_for >= self.patience and stuck_for >= self.patience:
                message = (f"kerasflow: task {job}:{index} at {address} stopped answering {silent_for:.0f} s ago "
                           f"({problem}), and TensorFlow has waited for it ever since without a deadline. This "
                           f"process exits (code {self.EXIT_CODE}) rather than hang: restart `python -m "
                           "kerasflow.worker` on that host and resume from your last checkpoint "
                           "(keras.callbacks.BackupAndRestore or ModelCheckpoint).")
                sys.stdout.flush()
                print(message, file=sys.stderr, flush=True)
                self._exit(self.EXIT_CODE)
                return message
        return None

    def _main_call_since(self, now: float) -> float | None:
        """Since when the main thread has been in the same TensorFlow call (None: it is not in one)."""
        frame = sys._current_frames().get(self._main)
        call = (id(frame.f_code), frame.f_lasti, id(frame)) if frame is not None and (
            f"{os.sep}tensorflow{os.sep}" in frame.f_code.co_filename) else None
        if call != self._call:
            self._call, self._call_since = call, now
        return self._call_since if call is not None else None


def exposure_warning(target: str) -> str:
    """What a TensorFlow server kerasflow starts exposes, for the warning it prints.

    TensorFlow's gRPC server binds the wildcard address (``GrpcServer::Init`` listens on
    ``0.0.0.0:PORT`` whatever the cluster spec names; ``ServerDef`` has no address field), so
    kerasflow cannot narrow it: it says so each time it starts one.

    Example:
        >>> exposure_warning("grpc://127.0.0.1:2222").split(", whatever")[0]
        "TensorFlow's gRPC server listens on every network interface (port 2222)"
    """
    port = target.rsplit(":", 1)[-1]
    return (f"TensorFlow's gRPC server listens on every network interface (port {port}), whatever address "
            "TF_CONFIG names, and has no authentication: anyone who can reach the port can run code on this "
            "host. Keep it reachable only from the cluster's hosts (a private network or a firewall rule).")


def run_within(function, seconds: float):
    """``function()``'s result, or ``TimeoutError`` once ``seconds`` pass (it is then left running
    in a daemon thread: TensorFlow's remote calls cannot be cancelled).

    Example:
        >>> run_within(lambda: 6 * 7, 1.0)
        42
    """
    outcome: dict = {}

    def run():
        try:
            outcome["value"] = function()
        except BaseException as error:  # noqa: BLE001 - handed back to the caller's thread
            outcome["error"] = error

    worker = threading.Thread(target=run, name="kerasflow-connect", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise TimeoutError
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _cluster_devices(local_task: str) -> list[str]:
    import tensorflow as tf


    by_task: dict[str, list[str]] = {}
    for device in tf.config.list_logical_devices():
        if device.device_type not in ("CPU", "GPU"):
            continue
        name = normalize_device(device.name)
        task = task_of(name)
        by_task.setdefault("local" if task == local_task else task, []).append(name)
    ordered = []
    # This process's devices first: the strategy profiles on the first device, and TensorFlow's
    # profiler sees the kernels of this process only.
    for task in sorted(by_task, key=lambda t: (t != "local", t)):
        names = by_task[task]
        gpus = [n for n in names if device_type(n) == "GPU"]
        ordered.extend(sorted(gpus or names, key=_device_sort_key))
    return ordered


def _device_sort_key(name: str) -> tuple:
    prefix, _, index = name.rpartition(":")
    return (prefix, int(index) if index.isdigit() else 0)


def multihost_cluster(devices: Sequence[str], *, inter_host_link: Link | tuple | str | None = "measure",
                      intra_host_link: Link | tuple | None = None, name: str = "") -> Cluster:
    """The ``Cluster`` of a connected multi-host setup: one host per task, two levels of links.

    Args:
        devices: device names as ``connect`` returns them.
        inter_host_link: the network between tasks: a ``Link``/``(latency s, bytes/s)``, or
            ``"measure"`` (timed copies between the first devices of two tasks, with
            ``kerasflow.profiling.measure_links``).
        intra_host_link: the link inside a task (default: measured between the local GPUs,
            or the same-process figure for CPUs).
        name: the cluster's label.

    Kinds: a remote GPU takes the kind of the local GPU of the same index (hosts are assumed
    alike), so the chief's profile prices every device. With GPUs, the first device's task's CPU
    is the cluster's host (``Cluster.host``, joined to the GPUs by PCIe 3): the ops no GPU can run
    go there.

    Raises:
        KerasflowError: a device that does not exist.

    Example:
        >>> cluster = multihost_cluster(devices, inter_host_link=(25e-6, 12.5e9))  # doctest: +SKIP
        >>> sorted(cluster.hosts())  # doctest: +SKIP
        [0, 1, 2]
    """
    from kerasflow.devices import device_kind, device_memory, host_cpu
    from kerasflow.profiling.links import measure_links

    devices = list(devices)
    hosts: dict[str, int] = {}
    built = []
    for device in devices:
        # The local GPU of the same index describes it: hosts are assumed alike.
        built.append(Device(device, device_kind(device), device_memory(device),
                            host=hosts.setdefault(task_of(device), len(hosts))))
    if intra_host_link is None:
        first_host = [d for d in devices if hosts[task_of(d)] == 0]
        if len(first_host) > 1 and device_type(first_host[0]) == "GPU":
            intra_host_link = measure_links(first_host[:2]).links[(first_host[0], first_host[1])]
        else:
            intra_host_link = SAME_PROCESS
    if isinstance(inter_host_link, str):
        if inter_host_link != "measure":
            raise KerasflowError(f"inter_host_link must be a Link, (latency, bandwidth) or 'measure'; received "
                                 f"{inter_host_link!r}.")
        firsts = {}
        for device in devices:
            firsts.setdefault(hosts[task_of(device)], device)
        if len(firsts) > 1:
            a, b = firsts[0], firsts[1]
            inter_host_link = measure_links([a, b], sizes=tuple(2**k for k in range(10, 25, 2)),
                                            repeats=3).links[(a, b)]
        else:
            inter_host_link = intra_host_link
    host = None  # with GPUs, the chief's CPU runs the ops no GPU can (``Cluster.host``)
    if device_type(devices[0]) == "GPU":
        cpu = host_cpu(devices[0])
        host = Device(cpu, device_kind(cpu), device_memory(cpu), host=hosts[task_of(devices[0])])
    return Cluster.two_level(built, intra_host_link, inter_host_link, name=name or f"{len(hosts)}-host:{len(devices)}",
                             host=host)
