"""Tiny hand-made graphs and clusters for the planner tests."""

from kerasflow.planner import Cluster, Device, Link, Op, OpGraph, Plan, Shard


def devices(count, kind="X", memory=10**9, **kwargs):
    """``count`` devices of ``kind`` with free local copies (so split/concat cost 0)."""
    defaults = {"memory_bandwidth": 1e30, "launch_overhead": 0.0}
    defaults.update(kwargs)
    return [Device(f"/D:{i}", kind, memory, **defaults) for i in range(count)]


def cluster(count=2, latency=0.0, bandwidth=100.0, **kwargs):
    """``count`` devices of kind X joined by identical links."""
    return Cluster(devices(count, **kwargs), default_link=Link(latency, bandwidth), name=f"test{count}")


def op(name, cost=1.0, out=(), **kwargs):
    """An op of kind X costing ``cost`` seconds with the given output sizes."""
    return Op(name, cost={"X": cost}, output_bytes=list(out), **kwargs)


def normalization(synchronized_layers=("bn",)):  # the profile's list of such layers
    """A layer "bn" normalizing a batch with its statistic (40 B): ``mean`` reduces ``m``'s
    output (4 B a sample) to it, ``norm`` uses it, a moving average ``avg`` (free) keeps it;
    backward, ``g`` reduces the batch again and ``dx`` uses that."""
    return OpGraph([
        op("m", (0.0, 1.0), [(0, 4)], batch_axis=0),
        op("mean", 1.0, [40], layer="bn"),
        op("mv", 0.0, [40], phase="other", persistent_bytes=40, colocation="mv"),
        op("avg", 0.0, [], phase="update", colocation="mv", layer="bn"),
        op("norm", (0.0, 1.0), [(0, 4)], layer="bn"),
        op("g", 1.0, [40], phase="backward", layer="bn"),
        op("dx", (0.0, 1.0), [(0, 4)], phase="backward", layer="bn"),
    ], [("m", "mean", 0), ("m", "norm", 0), ("mean", "norm", 0), ("mean", "avg", 0), ("mv", "avg", None),
        ("norm", "g", 0), ("g", "dx", 0)], batch_size=2,
        metadata={"synchronized_layers": list(synchronized_layers) if isinstance(synchronized_layers, tuple)
                  else synchronized_layers})


def split_normalization(synchronized_layers=("bn",)):
    """Layer "bn" normalizing a batch of 2 (``m``, 1 s a sample, on /D:0) with its statistic (40 B),
    split in halves over two devices: ``mean`` (1 s a shard) reduces the batch, ``decay`` (free)
    takes the statistic to the moving average ``avg``, ``norm`` (1 s a sample) uses it; backward,
    ``g`` (1 s a shard) reduces the batch again and ``dx`` (1 s a sample) uses that, and ``dscale``
    (free), a weight's gradient, goes to its update ``apply``."""
    graph = OpGraph([
        op("m", (0.0, 1.0), [(0, 4)], batch_axis=0),
        op("mean", 1.0, [40], layer="bn"),
        op("decay", 0.0, [40], layer="bn"),
        op("mv", 0.0, [40], phase="other", persistent_bytes=40, colocation="mv"),
        op("avg", 0.0, [], phase="update", colocation="mv", layer="bn"),
        op("norm", (0.0, 1.0), [(0, 4)], layer="bn"),
        op("g", 1.0, [40], phase="backward", layer="bn"),
        op("dx", (0.0, 1.0), [(0, 4)], phase="backward", layer="bn"),
        op("dscale", 0.0, [40], phase="backward", layer="bn"),
        op("apply", 0.0, [], phase="update", colocation="mv", layer="bn"),
    ], [("m", "mean", 0), ("m", "norm", 0), ("mean", "norm", 0), ("mean", "decay", 0), ("decay", "avg", 0),
        ("mv", "avg", None), ("norm", "g", 0), ("g", "dx", 0), ("norm", "dscale", 0), ("dscale", "apply", 0),
        ("mv", "apply", None)], batch_size=2,
        metadata={"synchronized_layers": list(synchronized_layers)})
    halves = (Shard("/D:0", 0.5), Shard("/D:1", 0.5))
    return graph, Plan(placement={o.name: "/D:0" for o in graph.ops}, splits={"bn": halves})
