"""A planned step runs as many fused kernels as the default placement does.

TensorFlow's graph optimizer runs a convolution or matmul with its bias and activation, and a
filter's gradient with its bias' gradient, as one kernel, but only when no control edge touches
the chain; the per-device order kerasflow adds as control edges stopped it (the HEFT plan of the
zoo's Inception-like CNN measured 41 ms a step with its order, 27 ms without). The profile keeps
each chain in one group and the applier leaves it out of the order. Here the zoo's CNN and MLP
train under HEFT's plan with its order applied, and the fused kernels the plan's first step ran
(``PlacementReport.fused_kernels``) must number those of plain Keras' step.

With fused chains ordered like any op, the CNN's planned step ran 3 or 4 fused kernels instead
of 9 (its four filter gradients apart from their bias gradients, one or two convolutions apart
from their bias, as the profile's timings shape the schedule). The MLP's only chains are
forward matmul-bias-activation chains, which a list schedule orders back to back: those control
edges repeat data edges, which Grappler's dependency optimizer drops, so its count holds either
way.
"""

import keras
import pytest

import kerasflow
from kerasflow.planner import heft
from kerasflow.strategies import Collaborators
from kerasflow.strategies.readback import fused_kernel_count
from kerasflow.testing.first_step import first_step_recorder
from kerasflow.testing.testbed_models import build

STEPS = 8  # the plan is made after step 3 (warm-up 2, profile 1) and its first step read back
OPTIONS = dict(verbose=0, warmup_steps=2, profile_steps=1, drop_slower_plan=False)


def heft_with_its_order(request):
    """HEFT's plan with its per-device order, whatever the other candidates predict (the
    planner's own ranking drops an order that simulates slower than none)."""
    return [heft(request.graph, request.cluster)]


def default_fused_kernels(name: str) -> int:
    """The fused kernels plain Keras' step of the zoo model ``name`` runs (the step is the only
    function of that first step with any)."""
    recorder = first_step_recorder()
    keras.utils.set_random_seed(0)
    model, (x, y) = build(name, keras)
    model.fit(x, y, batch_size=len(y), epochs=1, verbose=0, shuffle=False, callbacks=[recorder])
    return fused_kernel_count(recorder.partition_graphs)


def planned(name: str):
    """The strategy that trained the zoo model ``name`` under HEFT's plan, and its placement report."""
    strategy = kerasflow.FastTStrategy(collaborators=Collaborators(planner=heft_with_its_order), **OPTIONS)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model, (x, y) = build(name, keras)
    model.fit(x, y, batch_size=len(y), epochs=STEPS, verbose=0, shuffle=False)
    return strategy, strategy.placement_report()


@pytest.mark.parametrize("name", ["cnn", "mlp"])
def test_a_planned_step_runs_as_many_fused_kernels_as_the_default_placement(name):
    strategy, report = planned(name)
    assert strategy.plan_in_force and strategy.plan.algorithm == "heft"
    assert len(strategy.plan.devices()) > 1 and strategy.plan.order
    assert report == [] and report.not_applied == []  # every op where planned, the whole order applied
    assert report.fused_kernels == default_fused_kernels(name) > 0
