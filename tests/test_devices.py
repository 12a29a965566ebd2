"""Device helpers: the local GPUs as TensorFlow describes them (device lists and details given by
hand, as TensorFlow returns them), and waiting for work a device runs after the host has moved on."""

import time

import tensorflow as tf

from kerasflow.devices import (UNKNOWN_DEVICE_MEMORY, canonical_device, describe_gpus, device_kind, device_memory,
                               known_devices, shared_cards, wait_for_devices)
from kerasflow.planner import Link
from kerasflow.planner.ir.hardware import DEVICE_SPECS
from kerasflow.planner.ir.machine import SharedCompute
from kerasflow.profiling.links import LinkMeasurement, cluster_of
from kerasflow.strategies.collaborators import stopwatch


def test_a_step_ends_when_the_work_queued_for_the_devices_is_done():
    # Asynchronous execution queues each op and returns at once, as a GPU's stream runs a step's
    # kernels after the train function returned: the stopwatch and the profiler's step mark
    # end after the queued work, not when the host returns.
    finished = []

    def slow_op():
        time.sleep(0.3)
        finished.append("done")

    tf.config.experimental.set_synchronous_execution(False)
    try:
        tf.py_function(slow_op, [], [])
        assert finished == []  # the host moved on
        wait_for_devices()
        assert finished == ["done"]
        # A step whose outputs the stopwatch cannot wait for (none): it waits for the devices.
        _, seconds = stopwatch(lambda: tf.py_function(slow_op, [], []), plan=None)
        assert finished == ["done", "done"] and seconds >= 0.3
    finally:
        tf.config.experimental.set_synchronous_execution(True)


H100 = {"device_name": "NVIDIA H100 80GB HBM3", "compute_capability": (9, 0)}


def test_one_card_carved_in_two_is_two_gpus_of_its_kind_with_their_own_memory_sharing_its_compute():
    gpus = describe_gpus([("/physical_device:GPU:0", H100, [38000, 38000])])
    assert [(g.name, g.card, g.kind, g.memory) for g in gpus] == [
        ("/GPU:0", "/physical_device:GPU:0", "H100", 38000 * 2**20),
        ("/GPU:1", "/physical_device:GPU:0", "H100", 38000 * 2**20)]
    assert gpus[1].found == "kind from its name; memory from its logical configuration (38000 MiB)"
    # Both halves keyed "H100", as a profile on either is: the planner finds costs for both, and
    # prices them as one card's compute.
    links = LinkMeasurement({(a, b): Link(5e-6, 100e9) for a in ("/GPU:0", "/GPU:1") for b in ("/GPU:0", "/GPU:1")
                             if a != b}, True, "by hand")
    pcie = Link(8e-6, 25e9)
    cluster = cluster_of(["/GPU:0", "/GPU:1"], links=links, gpus=gpus, bandwidths={"/GPU:0": 2e12, "/GPU:1": 2e12},
                         host_link=pcie)
    assert cluster.kinds() == ["H100"] and cluster.shares_compute(["/GPU:0", "/GPU:1"])
    # The host CPU beside them runs what no GPU can (string ops, lookup tables), over that link.
    assert (cluster.host.name, cluster.host.kind, cluster.host_link) == ("/CPU:0", "CPU", pcie)
    assert cluster.hosted.link("/CPU:0", "/GPU:1") == cluster.hosted.link("/GPU:1", "/CPU:0") == pcie
    assert [cluster.device(d).memory for d in cluster.device_names] == [38000 * 2**20] * 2
    assert [cluster.device(d).memory_bandwidth for d in cluster.device_names] == [2e12] * 2  # copy kernels
    assert device_kind("/job:worker/replica:0/task:1/device:GPU:1", gpus) == "H100"  # another host, alike


def test_gpus_are_numbered_over_the_visible_cards_only_and_a_second_card_is_its_own():
    a100 = {"device_name": "NVIDIA A100-SXM4-80GB", "compute_capability": (8, 0)}
    gpus = describe_gpus([("/physical_device:GPU:1", a100, None), ("/physical_device:GPU:3", H100, [1000, 2000])])
    assert [(g.name, g.card, g.kind, g.memory // 2**20) for g in gpus] == [
        ("/GPU:0", "/physical_device:GPU:1", "A100", 80 * 1024),  # the name's 80GB, not the 40 GB datasheet
        ("/GPU:1", "/physical_device:GPU:3", "H100", 1000), ("/GPU:2", "/physical_device:GPU:3", "H100", 2000)]
    assert shared_cards(["/GPU:0", "/GPU:1", "/GPU:2"], gpus) == [SharedCompute(("/GPU:1", "/GPU:2"), 2, 1)]
    assert shared_cards(["/GPU:0", "/GPU:1"], gpus) == []  # one half of the second card alone shares nothing


def test_an_unknown_card_keeps_its_name_as_kind_and_says_what_was_assumed():
    gpus = describe_gpus([("/physical_device:GPU:0", {"device_name": "NVIDIA Quadro P1000",
                                                      "compute_capability": (6, 1)}, None)])
    assert (gpus[0].kind, gpus[0].memory) == ("NVIDIA Quadro P1000", UNKNOWN_DEVICE_MEMORY)
    assert gpus[0].found == ("kind 'NVIDIA Quadro P1000': no preset has its name or its compute capability (6, 1); "
                             "memory unknown: 16 GiB assumed")
    assert device_memory("/GPU:0", gpus) == UNKNOWN_DEVICE_MEMORY and device_kind("/GPU:5", gpus) == "GPU"


def test_a_grace_hopper_card_is_an_h100_by_its_compute_capability_not_an_h200_by_its_name():
    gpus = describe_gpus([("/physical_device:GPU:0", {"device_name": "NVIDIA GH200 480GB",
                                                      "compute_capability": (9, 0)}, None)])
    assert (gpus[0].kind, gpus[0].memory) == ("H100", DEVICE_SPECS["H100"].memory)  # 480 GB counts the CPU's memory
    assert gpus[0].found.startswith("kind from its compute capability 9.0 ('NVIDIA GH200 480GB' is no preset's name)")


def test_a_device_has_one_spelling_short_and_in_capitals_where_it_is_local():
    assert [canonical_device(name) for name in ("/CPU:1", "/cpu:1", "/Cpu:1", "/device:CPU:1",
                                                "/job:localhost/replica:0/task:0/device:cpu:1")] == ["/CPU:1"] * 5
    assert canonical_device("/gpu:12") == "/GPU:12"
    # Another task's device keeps its full name: it is that task's, not this process's.
    remote = "/job:worker/replica:0/task:1/device:GPU:0"
    assert canonical_device(remote) == remote


def test_the_known_devices_are_tensorflows_in_that_spelling():
    # The tests run on 4 logical CPUs (conftest.py).
    assert {d for d in known_devices() if d.startswith("/CPU")} == {"/CPU:0", "/CPU:1", "/CPU:2", "/CPU:3"}
    assert all(canonical_device(d) == d for d in known_devices())
