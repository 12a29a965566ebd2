"""A model that takes only the batch size it was built for (the keras.io Switch Transformer: its
router reshapes the tokens with that size) gets a plan, kept for the rest of ``fit`` through both
doors, and trains as plain Keras does, every weight bit for bit.

kerasflow profiles it at its own batch (the half batch it also traces is refused) and leaves out
every plan that would hand a device fewer rows; the compatibility suite runs the same model in the
default configuration and through a forced replacement and drop (``test_tutorial_models.py``).
"""

import dataclasses

import numpy as np
import pytest

from kerasflow.planner import ranked_plans
from kerasflow.strategies import Collaborators
from kerasflow.testing import ScriptedStopwatch
from kerasflow.testing.tutorial_models import PATTERNS, SWITCH_BATCH
from tests.compat.test_tutorial_models import train

SWITCH = next(p for p in PATTERNS if p.name == "switch_transformer")
# Calls of the train function before the plan is kept: 2 warm-up, 1 profiled, the plan's first
# step, an untimed default step and 3 rounds of a planned and a default step; 4 steps an epoch.
EPOCHS = 3


def layerwise_with_data_parallelism_asked_for(request):
    """The layer-wise plan on the logical CPUs taken as devices of their own, with data
    parallelism among the candidates (the default configuration does not try it for this model:
    its router couples the batch's samples), so that the refusal is what leaves it out."""
    return ranked_plans(dataclasses.replace(request, cluster=request.cluster.independent(), replicated=True,
                                            candidates=("layerwise_model_parallel", "data_parallel")))


@pytest.fixture(scope="module")
def plain_keras():
    model, history, predictions, _ = train(SWITCH, None, EPOCHS)
    return history, predictions, [np.asarray(w) for w in model.weights]


@pytest.mark.parametrize("door", ["strategy", "callback"])
def test_a_model_that_takes_one_batch_size_runs_a_plan_as_plain_keras_does(plain_keras, door):
    kept = Collaborators(planner=layerwise_with_data_parallelism_asked_for,
                         stopwatch=ScriptedStopwatch({None: 1.0, "layerwise_model_parallel": 0.5}))
    model, history, predictions, handle = train(SWITCH, door, EPOCHS, collaborators=kept)
    assert handle.plan_in_force and handle.plan.algorithm == "layerwise_model_parallel"
    assert len(set(handle.plan.placement.values())) > 1
    why = handle.report.excluded["data_parallel"]
    # Profiled again at one replica's rows of the 4 devices' (12), which the model refused.
    assert why == (f"hands a device fewer rows than the batch of {SWITCH_BATCH}, and the model refused a batch of "
                   f"{SWITCH_BATCH // 4} while it was profiled")
    plain_history, plain_predictions, plain_weights = plain_keras
    assert history == plain_history
    np.testing.assert_array_equal(predictions, plain_predictions)
    for weight, plain in zip(model.weights, plain_weights):
        np.testing.assert_array_equal(np.asarray(weight), plain, err_msg=weight.path)
