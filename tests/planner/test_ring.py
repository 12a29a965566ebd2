"""The ring schedules, the fusion buffers and the all-reduces the simulator prices for data parallelism."""

import random

import pytest

from kerasflow.planner import Cluster, OpGraph, baselines, simulate, synthetic
from kerasflow.planner.sim.ring import fusion_buffers, ring_chunks, ring_schedule

from .helpers import cluster, op


def test_three_devices_send_each_chunk_around_the_ring_as_worked_out_by_hand():
    # Reduce-scatter: at step s position i sends chunk i - s; all-gather: chunk i + 1 - s.
    #   step 0: 0->1 c0, 1->2 c1, 2->0 c2      step 2: 0->1 c1, 1->2 c2, 2->0 c0
    #   step 1: 0->1 c2, 1->2 c0, 2->0 c1      step 3: 0->1 c0, 1->2 c1, 2->0 c2
    expected = [(0, 0, 1, 0), (0, 1, 2, 1), (0, 2, 0, 2), (1, 0, 1, 2), (1, 1, 2, 0), (1, 2, 0, 1),
                (2, 0, 1, 1), (2, 1, 2, 2), (2, 2, 0, 0), (3, 0, 1, 0), (3, 1, 2, 1), (3, 2, 0, 2)]
    sends = ring_schedule(3)
    assert [(s.step, s.src, s.dst, s.chunk) for s in sends] == expected
    assert [s.reduce for s in sends] == [True] * 6 + [False] * 6


def test_chunks_are_as_even_as_possible():
    assert ring_chunks(10, 3) == [4, 3, 3]
    assert ring_chunks(2, 4) == [1, 1, 0, 0]


@pytest.mark.parametrize("parts", [2, 3, 4, 5])
def test_every_position_ends_with_the_whole_sum_each_chunk_summed_once(parts):
    rng = random.Random(parts)
    values = [[rng.randint(-9, 9) for _ in range(parts)] for _ in range(parts)]  # position -> chunk -> value
    held = [list(row) for row in values]
    terms = [[{i} for _ in range(parts)] for i in range(parts)]  # which positions' values each holds
    for send in ring_schedule(parts):
        value, contributors = held[send.src][send.chunk], terms[send.src][send.chunk]
        if send.reduce:
            assert not contributors & terms[send.dst][send.chunk]  # nothing is added twice
            held[send.dst][send.chunk] += value
            terms[send.dst][send.chunk] = terms[send.dst][send.chunk] | contributors
        else:
            held[send.dst][send.chunk], terms[send.dst][send.chunk] = value, contributors
    sums = [sum(values[i][c] for i in range(parts)) for c in range(parts)]
    assert held == [sums] * parts
    assert all(t == set(range(parts)) for row in terms for t in row)


def test_gradients_are_fused_first_fit_largest_first():
    # Largest first: 60 opens buffer 0 (40 left), 50 does not fit and opens buffer 1, 30 fits
    # in buffer 0 (10 left), then 10 fills it; a gradient over the limit gets a buffer of its own.
    assert fusion_buffers([10, 60, 30, 50], limit=100) == [[1, 2, 0], [3]]
    assert fusion_buffers([250, 10], limit=100) == [[0], [1]]
    assert fusion_buffers([]) == []


def test_the_fused_gradients_are_summed_by_one_collective_over_the_data_parallel_devices():
    graph, cluster = synthetic.chain_mlp(layers=2), Cluster.preset("2xK80-pcie")
    result = simulate(graph, cluster, baselines.data_parallel(graph, cluster))
    reduced = {name: (start, end) for name, role, start, end in
               zip(result.task_names, result.task_role, result.task_start, result.task_end) if role == "allreduce"}
    # Small gradients: one fused buffer, one all-reduce task, one collective timed by that
    # task over both devices; it starts after the last weight gradient is ready.
    assert len(reduced) == 1
    (start, end), = reduced.values()
    collective, = result.collectives
    assert collective.task.startswith("fused(2 gradients") and collective.devices == ("/GPU:0", "/GPU:1")
    assert (collective.start, collective.end) == (start, end) and result.ring_transfers == []
    assert collective.bytes == sum(op.output_bytes[0].at(graph.batch_size) for op in graph.ops
                                   if op.name.endswith("_grad_weight"))
    times = result.times()
    assert start >= max(e for name, (s, e) in times.items() if name.endswith(("_grad_weight@r0", "_grad_weight@r1")))
    assert simulate(graph, cluster, baselines.single_device(graph, cluster)).collectives == []


def test_only_values_that_only_updates_read_are_fused_with_the_gradients():
    # A recurrent layer's pattern: its loop ("loop", run once per replica because it is
    # colocated with the weight) reads a backward accumulator "acc". If "acc" were fused with
    # the weight gradient "g", the buffer would wait for "g", "g" for "f", "f" for "loop" and
    # "loop" for the buffer: a deadlock. "acc" is reduced alone; the buffer holds "g" only.
    graph = OpGraph([op("w", 0.0, [400], persistent_bytes=400, colocation="w"),
                     op("acc", 0.0, [0], phase="backward", batch_axis=0),
                     op("loop", 1.0, [(0, 4)], colocation="w"),
                     op("f", (0.0, 1.0), [(0, 4)], batch_axis=0),
                     op("g", (0.0, 1.0), [400], phase="backward", batch_axis=0),
                     op("apply", 1.0, [], phase="update", colocation="w")],
                    [("w", "loop", 0), ("acc", "loop", 0), ("loop", "f", 0), ("f", "g", 0), ("g", "apply", 0)],
                    batch_size=4)
    result = simulate(graph, cluster(2), baselines.data_parallel(graph, cluster(2)))
    reduced = sorted(name for name, role in zip(result.task_names, result.task_role) if role == "allreduce")
    assert reduced == ["acc:0@allreduce", "g:0@allreduce"]
    assert sorted(c.task for c in result.collectives) == ["acc:0@allreduce", "g:0@allreduce"]


def test_gradients_after_another_update_get_buffers_of_their_own():
    # A GAN's step: the discriminator's gradient "gd" updates "d" ("apply_d"); the generator's
    # loss "f" then reads the updated "d", and its gradient "gg" updates "g". One buffer of both
    # gradients would wait for "gg", which waits for "apply_d", which waits for the buffer: each
    # update round gets its own buffer, and the second starts after the first's update.
    graph = OpGraph([op("d", 0.0, [400], persistent_bytes=400, colocation="d"),
                     op("g", 0.0, [400], persistent_bytes=400, colocation="g"),
                     op("x", (0.0, 1.0), [(0, 4)], batch_axis=0),
                     op("gd", (0.0, 1.0), [400], phase="backward", batch_axis=0),
                     op("apply_d", 1.0, [], phase="update", colocation="d"),
                     op("f", (0.0, 1.0), [(0, 4)], batch_axis=0),
                     op("gg", (0.0, 1.0), [400], phase="backward", batch_axis=0),
                     op("apply_g", 1.0, [], phase="update", colocation="g")],
                    [("d", "x", 0), ("x", "gd", 0), ("gd", "apply_d", 0), ("apply_d", "f", None), ("g", "f", 0),
                     ("f", "gg", 0), ("gg", "apply_g", 0)],
                    batch_size=4)
    result = simulate(graph, cluster(2), baselines.data_parallel(graph, cluster(2)))
    times = result.times()
    assert sorted(name for name in times if name.endswith("@allreduce")) == ["gd:0@allreduce", "gg:0@allreduce"]
    assert times["gg:0@allreduce"][0] >= times["apply_d@r0"][1]


def test_fusion_buffers_are_first_fit_largest_first_on_many_random_gradients():
    def first_fit(sizes, limit):  # the rule, by a plain scan of the buffers
        buffers, room = [], []
        for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
            slot = next((b for b, free in enumerate(room) if sizes[index] <= free), None)
            if slot is None:
                buffers.append([])
                room.append(limit)
                slot = len(buffers) - 1
            buffers[slot].append(index)
            room[slot] -= sizes[index]
        return buffers

    rng = random.Random(7)
    for _ in range(500):
        sizes = [rng.choice([rng.uniform(0, 130), float(rng.randrange(0, 60)), 100.0, 0.0])
                 for _ in range(rng.randrange(0, 80))]
        assert fusion_buffers(sizes, limit=100) == first_fit(sizes, 100)
