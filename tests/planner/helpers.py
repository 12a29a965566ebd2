"""Tiny hand-made graphs and clusters for the planner tests."""

from kerasflow.planner import Cluster, Device, Link, Op


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
