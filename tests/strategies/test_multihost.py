"""FastTStrategy across tasks of TensorFlow's distributed runtime: local gRPC servers on loopback.

Two ``python -m kerasflow.worker`` processes (2 logical CPUs each, started by
``kerasflow.worker.local_cluster``, which stops them at the end whatever happens) serve their
devices; the chief runs in a process of its own, because connecting to a cluster changes
TensorFlow's context for the rest of a process.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import tensorflow as tf

import kerasflow
import kerasflow.multihost
from kerasflow import ClusterConnectionError
from kerasflow.worker import free_ports, local_cluster
from tests.strategies.test_fastt_strategy import baseline

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tf_config(cluster, job, index=0):
    return json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})


def environment(**extra):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), TF_CPP_MIN_LOG_LEVEL="2")
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def cluster():
    """A chief address (for the chief process the test starts) and two running workers."""
    with local_cluster(2, virtual_cpus=2) as spec:
        yield spec


def test_a_plan_across_tasks_trains_like_one_device(cluster, tmp_path):
    out = tmp_path / "result.json"
    chief = subprocess.run([sys.executable, "-m", "tests.strategies.multihost_chief", str(out), str(tmp_path)],
                           cwd=ROOT, env=environment(TF_CONFIG=tf_config(cluster, "chief")), capture_output=True,
                           text=True, timeout=300)
    assert chief.returncode == 0, chief.stderr[-4000:]
    result = json.loads(out.read_text())
    # the chief's CPU (it profiles there), then each worker's two
    assert len(result["devices"]) == 5 and result["devices"][0] == "/job:chief/replica:0/task:0/device:CPU:0"
    assert sorted(result["hosts"]) == ["0", "1", "2"]
    assert len(result["plan_tasks"]) >= 2, f"the plan stayed on one task: {result['plan_tasks']}"
    assert any(task.startswith("/job:worker") for task in result["variable_tasks"]), result["variable_tasks"]
    assert result["mismatches"] == 0
    assert result["loss"] == pytest.approx(baseline("cnn"), rel=1e-5)
    assert result["checkpoint_ok"]
    latency, bandwidth = result["measured_link"]
    assert latency >= 0 and bandwidth > 0


def test_a_task_that_never_started_is_named_within_the_timeout(cluster):
    (dead,) = free_ports(1)
    spec = tf.train.ClusterSpec({"worker": cluster["worker"] + [f"127.0.0.1:{dead}"]})
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(spec)
    started = time.monotonic()
    with pytest.raises(ClusterConnectionError, match=rf"task worker:2 at 127\.0\.0\.1:{dead} .*kerasflow\.worker"):
        kerasflow.FastTStrategy(cluster_resolver=resolver, connect_timeout=2)
    assert time.monotonic() - started < 10


def test_the_worker_launcher_explains_a_missing_or_bad_tf_config():
    for config, expected in ((None, "TF_CONFIG is not set"), ("{not json", "not valid JSON"),
                             (json.dumps({"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "ps"}}),
                              "must name one of the cluster's jobs")):
        env = environment()
        env.pop("TF_CONFIG", None)
        if config is not None:
            env["TF_CONFIG"] = config
        run = subprocess.run([sys.executable, "-m", "kerasflow.worker"], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 2 and expected in run.stderr, run.stderr[-2000:]


def test_a_bad_tf_config_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"task": {}}')
    with pytest.raises(ClusterConnectionError, match="no 'cluster' mapping"):
        kerasflow.FastTStrategy()


def start_worker(cluster, index=0):
    process = subprocess.Popen([sys.executable, "-m", "kerasflow.worker"], cwd=ROOT,
                               env=environment(TF_CONFIG=tf_config(cluster, "worker", index)),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    process.startup_output = []
    for line in process.stdout:
        process.startup_output.append(line)
        if "serving on" in line:
            return process
    raise AssertionError(f"the worker did not start (exit {process.wait()})")


def wait_until_stopped(process, timeout=10.0):
    """Waits until the kernel shows ``process`` stopped (state T in /proc/<pid>/stat)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{process.pid}/stat") as stat:
            if stat.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.01)
    raise AssertionError(f"worker {process.pid} did not stop within {timeout} s")


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_the_worker_stops_on_sigterm_and_ctrl_c_within_seconds(stop):
    worker = start_worker({"worker": [f"127.0.0.1:{free_ports(1)[0]}"]})
    try:
        started = time.monotonic()
        worker.send_signal(stop)
        assert worker.wait(timeout=10) == 0
        assert time.monotonic() - started < 5
        assert "kerasflow.worker: stopped" in worker.stdout.read()
    finally:
        worker.kill()


def listening_addresses(port):
    """The local addresses listening on TCP ``port``, from the kernel's tables (hex, as listed)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as handle:
            for row in handle.readlines()[1:]:
                local, state = row.split()[1], row.split()[3]
                address, hex_port = local.rsplit(":", 1)
                if state == "0A" and int(hex_port, 16) == port:
                    found.append(address)
    return found


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads Linux's socket tables")
def test_the_worker_warns_that_it_listens_beyond_the_address_it_was_given():
    port = free_ports(1)[0]
    worker = start_worker({"worker": [f"127.0.0.1:{port}"]})
    try:
        # What the warning claims, checked against the kernel: the wildcard, not loopback only.
        # (When TensorFlow binds only the named address, this fails: drop the warning then.)
        addresses = listening_addresses(port)
        assert addresses and all(set(address) == {"0"} for address in addresses), addresses
    finally:
        worker.kill()
        worker.wait()
    warning = f"kerasflow.worker: warning: {kerasflow.multihost.exposure_warning(f'grpc://127.0.0.1:{port}')}\n"
    assert warning in worker.startup_output


def test_a_stopped_worker_is_named_within_the_timeout():
    address = f"127.0.0.1:{free_ports(1)[0]}"
    worker = start_worker({"worker": [address]})
    try:
        worker.send_signal(signal.SIGSTOP)  # alive, accepting TCP in the kernel, answering nothing
        wait_until_stopped(worker)  # a loaded machine delivers the stop late; the check must see it stopped
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec({"worker": [address]}))
        started = time.monotonic()
        with pytest.raises(ClusterConnectionError, match=rf"task worker:0 at {address} \(it accepts connections but "
                                                         "does not answer"):
            kerasflow.FastTStrategy(cluster_resolver=resolver, connect_timeout=2)
        assert time.monotonic() - started < 10
    finally:
        worker.send_signal(signal.SIGCONT)
        worker.kill()
        worker.wait()


def checks_while_the_main_thread_waits_in_tensorflow(watch, pauses):
    """Runs ``watch.check`` after each pause while the main thread waits in a TensorFlow call
    (a dequeue from an empty queue), then releases it; returns the checks' results."""
    queue, results = tf.queue.FIFOQueue(1, tf.int32), []

    def check_then_release():
        for pause in pauses:
            time.sleep(pause)
            results.append(watch.check(time.monotonic()))
        queue.close(cancel_pending_enqueues=True)

    checker = threading.Thread(target=check_then_release)
    checker.start()
    with pytest.raises(tf.errors.OutOfRangeError):
        queue.dequeue()
    checker.join()
    return results


def test_the_task_watch_exits_once_a_task_is_silent_through_a_stuck_call_for_its_patience():
    dead = f"127.0.0.1:{free_ports(1)[0]}"
    exits = []
    watch = kerasflow.multihost.TaskWatch([("worker", 3, dead)], patience=0.2, period=0.1, exit=exits.append)
    # first check: the call and the silence are both just seen (0 s); second, 0.3 s later: both >= 0.2
    first, second = checks_while_the_main_thread_waits_in_tensorflow(watch, [0.5, 0.3])
    assert first is None
    assert f"task worker:3 at {dead} stopped answering" in second and "exits (code 75)" in second
    assert exits == [75]


def test_the_task_watch_leaves_alone_a_process_not_waiting_in_tensorflow():
    exits = []
    watch = kerasflow.multihost.TaskWatch([("worker", 0, f"127.0.0.1:{free_ports(1)[0]}")], patience=0.1,
                                          exit=exits.append)
    results = []

    def check_twice():
        for _ in range(2):
            results.append(watch.check(time.monotonic()))
            time.sleep(0.3)

    checker = threading.Thread(target=check_twice)
    checker.start()
    checker.join()  # the main thread waits in Python's threading, not in TensorFlow
    assert results == [None, None] and exits == []


def stop_a_worker_during_fit(tmp_path, signal_name, when):
    """Runs the chief, which sends worker 1 ``signal_name`` during fit; returns the chief's run,
    its result, when it ended, and the worker's address."""
    chief, *workers = [f"127.0.0.1:{port}" for port in free_ports(3)]
    cluster = {"chief": [chief], "worker": workers}
    processes = [start_worker(cluster, index) for index in range(2)]
    try:
        out = tmp_path / "result.json"
        run = subprocess.run([sys.executable, "-m", "tests.strategies.multihost_chief", str(out), "--stop",
                              str(processes[1].pid), signal_name, when], cwd=ROOT,
                             env=environment(TF_CONFIG=tf_config(cluster, "chief")), capture_output=True, text=True,
                             timeout=300)
        ended = time.time()
        return run, json.loads(out.read_text()), ended, workers[1]
    finally:
        for process in processes:
            process.kill()
            process.wait()


@pytest.mark.parametrize("when", ["mid-epoch", "between-epochs"])
def test_a_worker_killed_during_fit_ends_it_with_one_clear_error_within_seconds(tmp_path, when):
    run, result, _, address = stop_a_worker_during_fit(tmp_path, "SIGKILL", when)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "/job:worker/replica:0/task:1" in result["variable_tasks"], result  # the plan put weights there
    # Its variables went with it: the fit cannot go on, and says which task and what to do.
    said = "\n".join(line for line in run.stderr.splitlines() if "kerasflow:" in line)
    assert result["raised"] == "ClusterConnectionError", f"{result.get('traceback', result)}\n{said}"
    assert f"/job:worker/replica:0/task:1 at {address} stopped answering during fit" in result["message"]
    assert "resume from your last checkpoint" in result["message"]
    assert result["seconds"] < 30


def test_a_worker_lost_where_tensorflow_would_wait_forever_ends_the_chief_with_one_line(tmp_path):
    # A stopped worker answers nothing: the next step waits for its tensors, for good.
    run, result, ended, address = stop_a_worker_during_fit(tmp_path, "SIGSTOP", "mid-epoch")
    assert run.returncode == kerasflow.multihost.TaskWatch.EXIT_CODE, run.stderr[-4000:]
    assert f"kerasflow: task worker:1 at {address} stopped answering" in run.stderr
    assert "resume from your last checkpoint" in run.stderr
    assert ended - result["stopped_at"] < 5 + 30  # the chief's connect_timeout, and some checks


@pytest.mark.parametrize("reply, message", [(b"", "does not answer"),
                                            (b"SSH-2.0-OpenSSH_9.6\r\n", "not as a TensorFlow")])
def test_a_port_that_is_not_tensorflow_is_named_within_the_timeout(reply, message):
    listener = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    connections = []

    def serve():
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            connections.append(connection)
            if reply:
                connection.sendall(reply)

    threading.Thread(target=serve, daemon=True).start()
    try:
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec({"worker": [address]}))
        started = time.monotonic()
        with pytest.raises(ClusterConnectionError, match=message):
            kerasflow.FastTStrategy(cluster_resolver=resolver, connect_timeout=2)
        assert time.monotonic() - started < 10
    finally:
        listener.close()
        for connection in connections:
            connection.close()
