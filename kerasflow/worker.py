"""``python -m kerasflow.worker``: serve this host's devices to a multi-host ``FastTStrategy``.

Run it on every host except the chief, with the same ``TF_CONFIG`` ``cluster`` everywhere and
this host's own ``task``::

    TF_CONFIG='{"cluster": {"worker": ["10.0.0.2:2222", "10.0.0.3:2222"]},
                "task": {"type": "worker", "index": 0}}' python -m kerasflow.worker

It starts a ``tf.distribute.Server`` for that task and serves until it is stopped (Ctrl-C or
SIGTERM, within a fraction of a second).

TensorFlow's gRPC runtime has no authentication, and its server listens on every network
interface whatever address ``TF_CONFIG`` names (TensorFlow offers no bind address): anyone who
can reach the port can run ops on this host, read and write its files. Run workers only on a
private network, with a firewall that lets only the cluster's hosts reach the port. The chief then runs ``FastTStrategy(cluster_resolver=...)`` and ``fit``.
``--virtual-cpus N`` splits the host CPU into N logical devices (to try it on one machine).
``--core C --threads 1`` pins the task to core C and runs one op at a time there, one thread
each (a device that shares no compute with the others: ``kerasflow.testbed`` starts its tasks
so); ``--exit-with PID`` ends the task when process PID is gone (no orphan outlives its chief).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Callable, Iterator

__all__ = ["main", "server_for", "free_ports", "wait_until_serving", "local_cluster", "serve_until_stopped"]


def server_for(config: str | dict, *, cpus: int | None = None, threads: int | None = None, start: bool = True):
    """A ``tf.distribute.Server`` for the task ``config`` (TF_CONFIG's content) names.

    ``cpus`` splits the host CPU into that many devices (the server builds its own devices
    from its session config, not from ``tf.config``'s logical devices); ``threads``: the
    threads one op may use and the ops that may run at once (TensorFlow's intra- and inter-op
    parallelism; None: its defaults).

    Raises:
        ClusterConnectionError: no ``cluster``/``task``, or a task not in the cluster.

    Example:
        >>> server = server_for({"cluster": {"worker": ["127.0.0.1:2222"]},
        ...                      "task": {"type": "worker", "index": 0}})  # doctest: +SKIP
        >>> server.target  # doctest: +SKIP
        'grpc://127.0.0.1:2222'
    """
    from kerasflow.multihost import parse_tf_config
    from kerasflow.planner.errors import ClusterConnectionError

    config = parse_tf_config(config)
    cluster, task = config["cluster"], config.get("task")
    if not isinstance(task, dict) or task.get("type") not in cluster:
        raise ClusterConnectionError(
            f"TF_CONFIG's 'task' must name one of the cluster's jobs {sorted(cluster)} with an 'index'; received "
            f"{task!r}.")
    job, index = task["type"], int(task.get("index", 0))
    if not 0 <= index < len(cluster[job]):
        raise ClusterConnectionError(f"Task index {index} is outside job {job!r}, which has {len(cluster[job])} "
                                     "task(s).")
    import tensorflow as tf

    session = tf.compat.v1.ConfigProto()
    if cpus:
        session.device_count["CPU"] = cpus
    if threads:
        session.intra_op_parallelism_threads = session.inter_op_parallelism_threads = threads
    return tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=job, task_index=index,
                                protocol=config.get("rpc_layer") or "grpc", config=session, start=start)


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` TCP ports free on ``host`` right now (the OS picks them).

    Example:
        >>> len(set(free_ports(3)))
        3
    """
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def wait_until_serving(process: subprocess.Popen, timeout: float) -> None:
    """Waits for a worker process's "serving on" line; a thread then drains its output to the end,
    so a chatty worker never blocks on a full pipe.

    Raises:
        ClusterConnectionError: it did not serve within ``timeout`` seconds (its output said).
    """
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout] + [lines.put(None)],
                     daemon=True).start()
    deadline, seen = time.monotonic() + timeout, []
    while True:
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            break
        if line is None:  # it exited
            break
        seen.append(line)
        if "serving on" in line:
            return
    from kerasflow.planner.errors import ClusterConnectionError

    raise ClusterConnectionError(f"A local worker did not start within {timeout:g} s; its output: "
                                 f"{''.join(seen)[-2000:]!r}")


@contextlib.contextmanager
def local_cluster(workers: int = 2, *, virtual_cpus: int = 2, timeout: float = 120.0) -> Iterator[dict]:
    """Runs ``workers`` worker processes on loopback for trying multi-host training on one machine.

    Each is ``python -m kerasflow.worker --virtual-cpus N`` on a free port; they are stopped
    when the block ends, whatever happens. The value is the ``TF_CONFIG`` cluster, with a free
    address for the chief; run the chief (in another process: connecting changes TensorFlow's
    context for good) with ``{"cluster": cluster, "task": {"type": "chief", "index": 0}}``.

    Raises:
        ClusterConnectionError: a worker did not start within ``timeout`` seconds.

    Example:
        >>> with local_cluster(2) as cluster:  # doctest: +SKIP
        ...     env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster,
        ...                                                  "task": {"type": "chief", "index": 0}}))
        ...     subprocess.run([sys.executable, "train.py"], env=env, check=True)
    """
    chief, *addresses = [f"127.0.0.1:{port}" for port in free_ports(workers + 1)]
    cluster = {"chief": [chief], "worker": addresses}
    environment = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    processes: list[subprocess.Popen] = []
    try:
        for index in range(workers):
            config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "kerasflow.worker", "--virtual-cpus", str(virtual_cpus)],
                env=dict(environment, TF_CONFIG=config), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True))
        for process in processes:
            wait_until_serving(process, timeout)
        yield cluster
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kerasflow.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--virtual-cpus", type=int, default=None, metavar="N",
                        help="split this host's CPU into N logical devices")
    parser.add_argument("--tf-config", default=None, help="the TF_CONFIG JSON (default: the environment's)")
    parser.add_argument("--core", type=int, default=None, metavar="C", help="run on this CPU core only")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="threads one op may use, and ops that may run at once (default: TensorFlow's)")
    parser.add_argument("--exit-with", type=int, default=None, metavar="PID",
                        help="stop when process PID is gone")
    args = parser.parse_args(argv)
    raw = args.tf_config or os.environ.get("TF_CONFIG")
    if not raw:
        print("kerasflow.worker: TF_CONFIG is not set; set it to this host's cluster and task (see --help).",
              file=sys.stderr)
        return 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from kerasflow.multihost import exposure_warning, parse_tf_config
    from kerasflow.planner.errors import KerasflowError

    try:
        if args.core is not None:
            from kerasflow.devices import pin_to_core

            pin_to_core(args.core)  # before TensorFlow makes its thread pools: they inherit the core
        config = parse_tf_config(raw)
        server = server_for(config, cpus=args.virtual_cpus, threads=args.threads)
    except (KerasflowError, OSError) as error:
        print(f"kerasflow.worker: {error}", file=sys.stderr)
        return 2
    task = config["task"]
    print(f"kerasflow.worker: warning: {exposure_warning(server.target)}", file=sys.stderr, flush=True)
    serving = f"kerasflow.worker: {task['type']}:{task.get('index', 0)} serving on {server.target}"
    serve_until_stopped(announce=lambda: print(serving, flush=True), exit_with=args.exit_with)
    print("kerasflow.worker: stopped", flush=True)
    return 0


def serve_until_stopped(announce: Callable[[], None] = lambda: None, poll_seconds: float = 0.2,
                        exit_with: int | None = None) -> None:
    """Blocks until SIGTERM or Ctrl-C (SIGINT) arrives, or process ``exit_with`` is gone; the
    server stops with the process.

    ``tf.distribute.Server.join()`` blocks in native code, where Python's signal handlers never
    run, so this waits in Python instead. ``announce`` runs once the handlers are in place: a
    launcher that stops the worker as soon as it says it serves must find them there (before,
    a SIGTERM right after "serving on" killed the worker with the default handler).

    Example:
        >>> serve_until_stopped(announce=lambda: print("serving"))  # doctest: +SKIP
    """
    stop = threading.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: stop.set())
    announce()
    while not stop.wait(poll_seconds):
        if exit_with is not None and not _alive(exit_with):
            return


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (one that exited and was not yet reaped counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # Linux shows an exited, unreaped process as a zombie ("Z")
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # TensorFlow's server has no clean shutdown: tearing its threads down at interpreter exit
    # takes seconds (more on a loaded machine) and gains nothing, so the process ends here.
    os._exit(code)
