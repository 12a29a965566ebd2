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
    for line in process.stdout:
        if "serving on" in line:
            return process
    raise AssertionError(f"the worker did not start (exit {process.wait()})")


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


def test_a_stopped_worker_is_named_within_the_timeout():
    address = f"127.0.0.1:{free_ports(1)[0]}"
    worker = start_worker({"worker": [address]})
    try:
        worker.send_signal(signal.SIGSTOP)  # alive, accepting TCP in the kernel, answering nothing
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
