"""TensorFlow's collective all-reduce as kerasflow asks for it: NCCL where TensorFlow would take it
only when asked (GPUs on cards of their own), a timeout on every sum, and the groups no collective
can sum refused before anything is traced."""

import pytest
import tensorflow as tf

from kerasflow import KerasflowError
from kerasflow.devices import LocalGPU
from kerasflow.strategies.collectives import TIMEOUT_SECONDS, Collectives, implementation


def cards(*physical):
    return [LocalGPU(f"/GPU:{i}", f"/physical_device:GPU:{card}", "H100", 2**35, "a test")
            for i, card in enumerate(physical)]


def test_nccl_is_asked_for_only_over_gpus_on_cards_of_their_own():
    assert implementation(["/GPU:0", "/GPU:1", "/GPU:2", "/GPU:3"], cards(0, 1, 2, 3)) == "nccl"
    assert implementation(["/GPU:0", "/GPU:1"], cards(0, 0)) == "ring"  # two logical GPUs of one card
    assert implementation(["/GPU:0", "/GPU:2"], cards(0, 1)) == "ring"  # a GPU TensorFlow does not have
    assert implementation(["/CPU:0", "/CPU:1"], cards(0, 1)) == "ring"


@pytest.mark.parametrize("devices, what", [
    (["/CPU:0", "/GPU:0"], r"devices of the kinds \['CPU', 'GPU'\]"),
    (["/job:worker/replica:0/task:0/device:CPU:0", "/job:worker/replica:0/task:1/device:CPU:0"],
     "devices of the tasks"),
])
def test_a_group_no_collective_sums_over_is_refused_before_anything_is_traced(devices, what):
    with pytest.raises(KerasflowError, match=f"no group of this process sums over {what}.*replicated='off'"):
        Collectives(devices)


def test_every_sum_says_how_and_how_long_it_waits():
    collectives = Collectives(["/CPU:0", "/CPU:1"])

    @tf.function
    def summed():
        parts = []
        for i, device in enumerate(collectives.devices):
            with tf.device(device):
                parts.append(tf.constant([1.0, 2.0]) * (i + 1))
        return collectives.all_reduce(parts)

    sums = [op for op in summed.get_concrete_function().graph.get_operations() if op.type == "CollectiveReduceV2"]
    assert len(sums) == 2
    assert {(op.get_attr("communication_hint"), op.get_attr("timeout_seconds")) for op in sums} == {
        (b"ring", TIMEOUT_SECONDS)}
    assert [t.numpy().tolist() for t in summed()] == [[3.0, 6.0], [3.0, 6.0]]


INCOMPLETE_GROUP = """
import time
import kerasflow
kerasflow.devices.virtual_cpus(2)
import tensorflow as tf
from kerasflow.strategies.collectives import Collectives

collectives = Collectives(["/CPU:0", "/CPU:1"], timeout=2.0)

@tf.function
def only_the_first_replica_sums():
    with tf.device("/CPU:0"):
        return collectives.all_reduce([tf.constant([1.0])])  # /CPU:1 never runs its part

started = time.perf_counter()
try:
    only_the_first_replica_sums()[0].numpy()
except tf.errors.DeadlineExceededError as error:
    print(f"ENDED {time.perf_counter() - started:.1f}")
    print(collectives.timed_out(error))
"""


@pytest.mark.slow  # a process of its own: TensorFlow aborts every collective of a process whose sum timed out
def test_a_sum_whose_group_never_completes_ends_within_its_timeout():
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", INCOMPLETE_GROUP], capture_output=True, text=True, timeout=120)
    lines = run.stdout.splitlines()
    ended = [float(line.split()[1]) for line in lines if line.startswith("ENDED")]
    assert ended and ended[0] < 10, (run.stdout, run.stderr[-2000:])  # 2 s, not forever
    assert any("A sum over ['/CPU:0', '/CPU:1'] (TensorFlow's ring) did not complete within 2 s" in line
               for line in lines)
