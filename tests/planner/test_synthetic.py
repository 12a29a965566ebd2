"""Tests of the synthetic training-step graphs."""

import pytest

from kerasflow.planner import InvalidGraphError, synthetic
from kerasflow.planner.ir.costmodel import estimate_costs, roofline
from kerasflow.planner.ir.graph import Affine
from kerasflow.planner.ir.hardware import DEVICE_SPECS


@pytest.mark.parametrize("family", sorted(synthetic.FAMILIES))
def test_families_are_training_steps(family):
    graph = synthetic.build(family)
    phases = {o.phase for o in graph.ops}
    assert phases == {"forward", "backward", "update", "other"}
    assert len(graph.topological_order()) == len(graph)
    variables = [o for o in graph.ops if o.persistent_bytes]
    updates = [o for o in graph.ops if o.phase == "update"]
    assert len(variables) == len(updates) > 0
    for update in updates:
        assert update.colocation in {v.colocation for v in variables}
    assert set(graph.device_kinds()) == set(DEVICE_SPECS)
    assert all(o.cost["V100"].fixed > 0 for o in graph.ops if o.type != "IteratorGetNext")


def test_dense_layer_sizes():
    graph = synthetic.chain_mlp(layers=2, width=256, input_dim=100, batch_size=8)
    matmul = graph.op("dense_0/MatMul")
    assert matmul.output_bytes == (Affine(0.0, 256 * 4),)
    assert graph.op("dense_0/kernel").persistent_bytes == (100 * 256 + 256) * 4 * 3
    assert matmul.flops == Affine(0.0, 2.0 * 100 * 256)
    assert graph.edge_bytes(next(e for e in graph.edges if e.src == "dense_0/MatMul")) == 8 * 256 * 4


def test_random_graphs_are_seeded_and_sized():
    a, b, c = (synthetic.random_layered(2000, seed=s) for s in (7, 7, 8))
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()
    assert 1700 < len(a) < 2300


def test_fan_out_gradients_are_summed():
    graph = synthetic.inception_like(blocks=1, branches=3)
    assert any(o.type == "AddN" and o.layer == "stem" for o in graph.ops)


def test_roofline_and_estimates():
    spec = DEVICE_SPECS["V100"]
    memory_bound = roofline(Affine(0, 1.0), Affine(0, 1e6), spec)
    assert memory_bound.per_sample == pytest.approx(1e6 / (spec.memory_bandwidth * 0.75))
    assert memory_bound.fixed == spec.launch_overhead
    graph = estimate_costs(synthetic.chain_mlp(layers=2, kinds=["CPU"]), ["H200", "K80"])
    assert set(graph.device_kinds()) == {"CPU", "H200", "K80"}
    with pytest.raises(InvalidGraphError, match="No datasheet figures for device kind 'TPU'"):
        estimate_costs(graph, "TPU")
    with pytest.raises(InvalidGraphError, match="Unknown synthetic family"):
        synthetic.build("resnet")


def test_ops_that_launch_no_kernel_cost_nothing_on_any_device():
    from kerasflow.planner.ir.graph import Affine, Op, OpGraph

    ops = [Op("c", type="Const", phase="other", output_bytes=[Affine(400.0)], bytes_accessed=Affine(400.0)),
           Op("r", type="Reshape", output_bytes=[Affine(0.0, 64.0)], bytes_accessed=Affine(0.0, 128.0)),
           Op("m", type="MatMul", output_bytes=[Affine(0.0, 64.0)], flops=Affine(0.0, 2e3),
              bytes_accessed=Affine(0.0, 128.0))]
    graph = estimate_costs(OpGraph(ops, [("c", "r", 0), ("r", "m", 0)]), ["V100", "H100"])
    for kind in ("V100", "H100"):
        assert graph.op("c").cost[kind] == Affine(0.0, 0.0)
        assert graph.op("r").cost[kind] == Affine(0.0, 0.0)
        # a kernel: at least the launch overhead, and more per sample
        assert graph.op("m").cost[kind].fixed > 0 and graph.op("m").cost[kind].per_sample > 0
