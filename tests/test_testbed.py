"""``kerasflow.testbed``: a task per core on loopback, started by one call, a plan trained across its
tasks, and nothing left behind (no worker, no bound port) however its chief ends."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

import kerasflow
from kerasflow import KerasflowError
from kerasflow.worker import free_ports

CORES = sorted(os.sched_getaffinity(0))


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:  # exited, not yet reaped by its parent
        return handle.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_start_refuses_a_count_of_tasks_the_cores_cannot_hold_and_a_started_tensorflow():
    with pytest.raises(KerasflowError, match=r"one task per core, from 2 to the \d+ cores.*Received: tasks=1$"):
        kerasflow.testbed.start(tasks=1)
    with pytest.raises(KerasflowError, match=rf"Received: tasks={len(CORES) + 1}$"):
        kerasflow.testbed.start(tasks=len(CORES) + 1)
    if len(CORES) >= 2:  # this test process made four logical CPUs (conftest): one process, one or the other
        with pytest.raises(KerasflowError, match=r"split into 4 logical CPUs \(kerasflow.devices.virtual_cpus\)"):
            kerasflow.testbed.start(tasks=2)


@pytest.mark.slow  # half a minute: a chief and a worker start TensorFlow, measure the link and train
@pytest.mark.skipif(len(CORES) < 2, reason="the testbed needs two cores")
def test_a_plan_trains_across_the_testbeds_tasks_and_nothing_is_left_once_it_stops(tmp_path):
    out = tmp_path / "chief.json"
    run = subprocess.run([sys.executable, "-m", "tests.testbed_chief", str(out)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["devices"] == [f"/job:worker/replica:0/task:{i}/device:CPU:0" for i in range(2)]
    assert result["kinds"] == [kerasflow.testbed.TESTBED_KIND]
    latency, bandwidth = result["link"]
    assert 0 < latency < 0.1 and 1e6 < bandwidth < 1e12  # measured, not a figure from a table
    # The plan put layers on both tasks, every op ran where planned, and tensors crossed between them.
    assert result["plan_tasks"] == ["/job:worker/replica:0/task:0", "/job:worker/replica:0/task:1"]
    assert result["in_force"] and result["off_plan"] == 0 and result["sent_between_tasks"] > 0
    assert all(loss == loss for loss in result["loss"])
    # stop() ended the worker; with the chief's exit every port is free again.
    assert result["workers_alive_after_stop"] == [False] and all(gone(pid) for pid in result["workers"])
    assert all(port_is_free(port) for port in result["ports"])


@pytest.mark.slow  # a worker starts TensorFlow
def test_a_worker_stops_by_itself_once_its_chief_is_gone():
    chief = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    address = f"127.0.0.1:{free_ports(1)[0]}"
    config = json.dumps({"cluster": {"worker": [address]}, "task": {"type": "worker", "index": 0}})
    worker = subprocess.Popen([sys.executable, "-m", "kerasflow.worker", "--core", str(CORES[-1]), "--threads", "1",
                               "--exit-with", str(chief.pid)], env=dict(os.environ, TF_CONFIG=config),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        kerasflow.worker.wait_until_serving(worker, timeout=120)
        chief.send_signal(signal.SIGKILL)  # nothing of the chief's runs after this
        chief.wait()
        started = time.monotonic()
        assert worker.wait(timeout=30) == 0
        assert time.monotonic() - started < 5 and port_is_free(int(address.rsplit(":", 1)[1]))
    finally:
        for process in (chief, worker):
            if process.poll() is None:
                process.kill()
                process.wait()
