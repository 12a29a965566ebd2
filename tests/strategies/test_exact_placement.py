"""A placement-only plan trains bit for bit as plain Keras does, however it spreads the ops.

TensorFlow runs some chains of ops as one fused kernel (a convolution with its bias and
activation, a filter's gradient with its bias' gradient, a tree of additions as one AddN), which
rounds otherwise than the same ops run one by one. A plan that put a chain's ops on two devices,
or ordered another op between them, therefore trained a few roundings away from plain Keras
(amplified by Adam to 7e-5 on some processors), and which plan the planner made rode on the
profile's noise: two outcomes across runs, as if a race. The profile keeps each such chain in
one colocation group and the applier leaves it out of the order. Here every op is scattered
round robin over three devices, each device's ops ordered (only colocation groups keep
together), so any chain left out of a group would run apart: the weights must still equal plain
Keras' bit for bit, after the plan kept through ``fit`` and after the plan timed and dropped.
"""

import numpy as np
import pytest

from kerasflow.planner import Plan
from kerasflow.planner.sim.predict import with_prediction
from kerasflow.strategies import Collaborators
from kerasflow.testing import ScriptedStopwatch
from tests.strategies import paths

DEVICES = ("/CPU:1", "/CPU:2", "/CPU:3")
SCATTERED = "scattered"


def scattered(request):
    """Every op on the next device in turn (a colocation group where its first member went),
    each device running its ops in the graph's order."""
    graph = request.graph
    placement, groups, order = {}, {}, {}
    for index, op in enumerate(graph.ops):
        device = DEVICES[index % len(DEVICES)]
        if op.colocation is not None:
            device = groups.setdefault(op.colocation, device)
        placement[op.name] = device
        order.setdefault(device, []).append(op.name)
    plan = Plan(placement=placement, order=order, batch_size=request.batch_size, algorithm=SCATTERED)
    return [with_prediction(plan, graph, request.cluster.independent())]


def weights_after(spec_name: str, door: str | None, planned_seconds: float) -> tuple[list, object]:
    """Every weight and optimizer variable after ``fit`` (plain Keras when ``door`` is None);
    ``planned_seconds`` against the default step's 1 s: kept (below 1) or dropped (above)."""
    watch = ScriptedStopwatch({None: 1.0, SCATTERED: planned_seconds})
    handle = paths.Door(door, Collaborators(planner=scattered, stopwatch=watch)) if door else paths.Door(None)
    run = paths.run(spec_name, door=handle)
    values = [value for name, value in run.outputs.items() if name.startswith(("weights[", "optimizer"))]
    return values, handle.handle


@pytest.mark.parametrize("spec_name", ["convnet", "bn_cnn"])
@pytest.mark.parametrize("door, planned_seconds", [("strategy", 0.5), ("callback", 2.0)],
                         ids=["strategy-kept", "callback-dropped"])
def test_a_scattered_placement_trains_bit_for_bit_as_plain_keras(spec_name, door, planned_seconds):
    expected, _ = weights_after(spec_name, None, planned_seconds)
    actual, handle = weights_after(spec_name, door, planned_seconds)
    assert handle.plan.algorithm == SCATTERED and handle.plan_in_force is (planned_seconds < 1.0)
    assert len(actual) == len(expected) > 0
    apart = [index for index, (a, e) in enumerate(zip(actual, expected)) if not np.array_equal(a, e)]
    assert apart == [], [float(np.max(np.abs(actual[i] - expected[i]))) for i in apart]


def test_the_profile_keeps_each_fused_chain_in_one_group():
    from kerasflow.profiling import profile_model

    paths.fresh()
    model = paths.built(paths.SPECS["convnet"])
    data = paths.data_of(paths.SPECS["convnet"])
    graph = profile_model(model, (data["x"][:32], data["y"][:32]), batch_size=16, steps=1, second_batch=False,
                          verbose=0)
    group = {op.name: op.colocation for op in graph.ops}
    by_type = {}
    for op in graph.ops:
        by_type.setdefault((op.layer, op.type), []).append(op.name)
    for layer in ("conv_a", "conv_b"):
        forward = [by_type[(layer, kind)][0] for kind in ("Conv2D", "BiasAdd", "Relu")]
        backward = [by_type[(layer, kind)][0] for kind in ("Conv2DBackpropFilter", "BiasAddGrad")]
        for chain in (forward, backward):
            assert group[chain[0]] is not None and {group[name] for name in chain} == {group[chain[0]]}, chain
