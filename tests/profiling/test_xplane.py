"""GPU profiles as TensorFlow writes them (XSpace protos built by hand, ``xplane_pb2``), read into
per-op kernel times whose totals are worked out here by hand (times in microseconds).

The shapes (../shared/DESIGN.md, "GPUs"): a GPU is a plane ``/device:GPU:N``; its kernels are
events on ``Stream #K(Compute)`` lines named after the CUDA kernel, the op in a ``tf_op`` stat (a
``ref_value`` into the plane's stat metadata in recent TensorFlow, else ``str_value``), a
``kernel_annotation`` or an ``annotation`` (``op:Type#shape=...#``, nested ones joined by ``::``);
copies on ``Stream #K(Memcpy...)`` lines with ``memcpy_details``. The profile viewer adds lines
(``TensorFlow Ops``, ``Steps``...) repeating those events when it loads a file; a file passed
around may hold them.
"""

import types
import warnings

import pytest
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from kerasflow.profiling.xplane import HOST, Copy, attribute, parse_xspace

US = 1_000_000  # picoseconds


class Planes:
    """An XSpace under construction: planes, lines and events by name, stats as text or references."""

    def __init__(self):
        self.space = xplane_pb2.XSpace()

    def plane(self, name: str):
        plane = self.space.planes.add()
        plane.name = name
        return plane

    @staticmethod
    def _id(table, name: str) -> int:
        for key, value in table.items():
            if value.name == name:
                return key
        key = len(table) + 1
        table[key].id, table[key].name = key, name
        return key

    def event(self, plane, line_name: str, name: str, begin_us: float, duration_us: float, **stats):
        """An event; a stat given as ``("ref", text)`` is stored as a reference to metadata named text."""
        line = next((line for line in plane.lines if line.name == line_name), None)
        if line is None:
            line = plane.lines.add()
            line.name = line.display_name = line_name
        event = line.events.add()
        event.metadata_id = self._id(plane.event_metadata, name)
        event.offset_ps, event.duration_ps = int(begin_us * US), int(duration_us * US)
        for key, value in stats.items():
            stat = event.stats.add()
            stat.metadata_id = self._id(plane.stat_metadata, key)
            if isinstance(value, tuple):
                stat.ref_value = self._id(plane.stat_metadata, value[1])
            elif isinstance(value, int):
                stat.int64_value = value
            else:
                stat.str_value = value

    def save(self, tmp_path) -> str:
        path = str(tmp_path / "profile.xplane.pb")
        with open(path, "wb") as handle:
            handle.write(self.space.SerializeToString())
        return path


def two_gpu_steps(derived: bool = False, unclaimed_us: float = 1.0) -> Planes:
    """Two steps of a Dense layer on a GPU, marked on the host at 0-100 and 200-300 µs.

    Step 0: the matmul kernel 30 µs (``tf_op`` by reference), the relu kernel 10 µs at 120 µs,
    after the host's mark ended (``annotation`` with shape arguments). Step 1: 32 µs (``tf_op`` as
    text) and 12 µs at 310 µs (a nested ``kernel_annotation``). A memset no op claims,
    ``unclaimed_us`` a step. The host runs the iterator (5 µs a step) and launches the two ops
    (2 µs each, which the kernels stand for). Copies: the batch to the GPU in step 0 (4096 B,
    4 µs), and 1024 B to GPU 1 in step 1 (3 µs). ``derived``: the lines the viewer adds, repeating
    every kernel and step.
    """
    planes = Planes()
    host, gpu = planes.plane(HOST), planes.plane("/device:GPU:0")
    for step, start in enumerate((0, 200)):
        planes.event(host, "python", "kerasflow_step#step_num=%d,_r=1#" % step, start, 100, step_num=step)
        planes.event(host, "tf_Compute/1", "IteratorGetNext:IteratorGetNext", start + 1, 5)
        planes.event(host, "tf_Compute/1", "dense/MatMul:MatMul", start + 7, 2)
        planes.event(host, "tf_Compute/1", "dense/Relu:Relu", start + 9, 2)
        planes.event(gpu, "Stream #7(Compute)", "void memset_kernel<float>", start + 50, unclaimed_us)
    compute = "Stream #7(Compute)"
    planes.event(gpu, compute, "void gemm_kernel<float, 128>", 10, 30, tf_op=("ref", "dense/MatMul:MatMul"))
    planes.event(gpu, compute, "void relu_kernel<float>", 120, 10, annotation="dense/Relu:Relu#shape=(16,8)#")
    planes.event(gpu, compute, "void gemm_kernel<float, 128>", 205, 32, tf_op="dense/MatMul:MatMul")
    planes.event(gpu, compute, "void relu_kernel<float>", 310, 12,
                 kernel_annotation="train_function:Fn#id=1#::dense/Relu:Relu#shape=(16,8)#")
    planes.event(gpu, "Stream #8(MemcpyH2D)", "MemcpyH2D", 1, 4, memcpy_details="size:4096 dest:0 async:1",
                 annotation="IteratorGetNext:IteratorGetNext")
    planes.event(gpu, "Stream #9(MemcpyP2P)", "MemcpyP2P", 250, 3, memcpy_details="size:1024 dest:1 async:1")
    if derived:
        for line in ("TensorFlow Ops", "XLA Ops"):
            for begin, duration, op in ((10, 30, "dense/MatMul:MatMul"), (120, 10, "dense/Relu:Relu"),
                                        (205, 32, "dense/MatMul:MatMul"), (310, 12, "dense/Relu:Relu")):
                planes.event(gpu, line, op, begin, duration, group_id=1)
        for step, start in enumerate((0, 200)):
            planes.event(gpu, "Steps", "kerasflow_step#step_num=%d#" % step, start, 100)
            planes.event(gpu, "TensorFlow Name Scope", "dense", start, 100)
            planes.event(host, "Steps", "kerasflow_step#step_num=%d#" % step, start, 100)
    return planes


def dense_ops() -> dict:
    op = types.SimpleNamespace
    return {"IteratorGetNext": op(type="IteratorGetNext", inputs=[], layer=None),
            "dense/MatMul": op(type="MatMul", inputs=[("IteratorGetNext", 0)], layer="dense"),
            "dense/Relu": op(type="Relu", inputs=[("dense/MatMul", 0)], layer="dense")}


@pytest.mark.parametrize("derived", [False, True], ids=["as written", "with the viewer's lines"])
def test_every_kernel_counts_once_for_its_op_and_its_step(tmp_path, derived):
    times = parse_xspace(two_gpu_steps(derived).save(tmp_path))
    assert times.steps == 2
    microseconds = {node: [round(s * 1e6, 6) for s in row] for node, row in times.per_step.items()}
    # The kernels, not the host's launches; the relu kernels counted in the step whose mark
    # began before them, though they ran after it ended.
    assert microseconds == {"dense/MatMul": [30, 32], "dense/Relu": [10, 12], "IteratorGetNext": [5, 5]}
    assert times.places == {"dense/MatMul": "/device:GPU:0", "dense/Relu": "/device:GPU:0", "IteratorGetNext": HOST}
    assert times.types == {"dense/MatMul": "MatMul", "dense/Relu": "Relu", "IteratorGetNext": "IteratorGetNext"}
    assert {kernel: [round(s * 1e6, 6) for s in row] for kernel, row in times.unclaimed["/device:GPU:0"].items()} \
        == {"void memset_kernel<float>": [1, 1]}
    assert [Copy(c.step, c.node, c.source, c.destination, c.bytes, round(c.seconds * 1e6, 6)) for c in times.copies] \
        == [Copy(0, "IteratorGetNext", HOST, "/device:GPU:0", 4096, 4.0),
            Copy(1, None, "/device:GPU:0", "/device:GPU:1", 1024, 3.0)]


def test_the_ops_get_their_median_kernel_times_and_coverage_is_per_place(tmp_path):
    times = parse_xspace(two_gpu_steps().save(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 1 µs of 43 unclaimed: below the warning's share
        result = attribute(times, dense_ops())
    assert {op: round(s * 1e6, 6) for op, s in result.seconds.items()} == \
        {"dense/MatMul": 31.0, "dense/Relu": 11.0, "IteratorGetNext": 5.0}
    assert result.coverage_by_place == {HOST: 1.0, "/device:GPU:0": pytest.approx(42 / 43)}
    assert result.coverage == pytest.approx(47 / 48)
    assert result.unmatched == {"void memset_kernel<float>": pytest.approx(1e-6)}
    # Copies are transfers, in no op's time: a step's mean per pair of memories.
    assert {pair: (size, round(seconds * 1e6, 6)) for pair, (size, seconds) in result.copies.items()} == \
        {(HOST, "/device:GPU:0"): (2048.0, 2.0), ("/device:GPU:0", "/device:GPU:1"): (512.0, 1.5)}


def test_a_device_whose_kernels_no_op_claims_is_named(tmp_path):
    times = parse_xspace(two_gpu_steps(unclaimed_us=8.0).save(tmp_path))
    with pytest.warns(RuntimeWarning) as caught:
        result = attribute(times, dense_ops())
    assert len(caught) == 1
    assert str(caught[0].message).startswith("kerasflow: 16% of the kernel time on /device:GPU:0 (0.008 ms a step) "
                                             "was claimed by no op of the step (largest: void memset_kernel<float>)")
    assert result.coverage_by_place["/device:GPU:0"] == pytest.approx(42 / 50)


def test_a_transpose_the_layout_optimizer_added_counts_for_its_op(tmp_path):
    planes = Planes()
    host, gpu = planes.plane(HOST), planes.plane("/device:GPU:0")
    planes.event(host, "python", "kerasflow_step#step_num=0,_r=1#", 0, 100)
    for name, duration in (("conv/Conv2D-0-TransposeNHWCToNCHW-LayoutOptimizer", 3),
                           ("conv/Conv2D", 20), ("conv/Conv2D-0-0-TransposeNCHWToNHWC-LayoutOptimizer", 2)):
        planes.event(gpu, "Stream #7", "void transpose_or_conv", 10, duration,
                     tf_op=("ref", f"StatefulPartitionedCall/{name}:{'Conv2D' if duration == 20 else 'Transpose'}"))
    result = attribute(parse_xspace(planes.save(tmp_path)),
                       {"conv/Conv2D": types.SimpleNamespace(type="Conv2D", inputs=[], layer="conv")})
    assert {op: round(s * 1e6, 6) for op, s in result.seconds.items()} == {"conv/Conv2D": 25.0}
    assert result.coverage == 1.0


def test_a_cpu_profile_reads_as_before(tmp_path):
    # The host's threads name each op's event node:Type; oneDNN's fused kernel, named after the
    # last op of its chain, is spread over the chain by FLOPs (3 to 1); another function's op
    # finds none.
    planes = Planes()
    host = planes.plane(HOST)
    planes.event(host, "python", "kerasflow_step#step_num=0,_r=1#", 0, 100)
    planes.event(host, "tf_Compute/1", "dense/BiasAdd:_MklFusedMatMul", 10, 40)
    planes.event(host, "tf_Compute/1", "other_function/op:Add", 60, 10)
    ops = {"dense/MatMul": types.SimpleNamespace(type="MatMul", inputs=[], layer="dense"),
           "dense/BiasAdd": types.SimpleNamespace(type="BiasAdd", inputs=[("dense/MatMul", 0)], layer="dense")}
    result = attribute(parse_xspace(planes.save(tmp_path)), ops, flops={"dense/MatMul": 3.0, "dense/BiasAdd": 1.0})
    assert {op: round(s * 1e6, 6) for op, s in result.seconds.items()} == {"dense/MatMul": 30.0, "dense/BiasAdd": 10.0}
    assert result.coverage == pytest.approx(40 / 50) and result.coverage_by_place == {HOST: pytest.approx(0.8)}
