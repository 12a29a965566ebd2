"""kerasflow.profiling: a live Keras training step as an ``OpGraph`` with measured costs.

Example:
    >>> import keras, numpy as np, kerasflow
    >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.Dense(1)])
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> graph = kerasflow.profiling.profile_model(model, (np.ones((32, 8)), np.ones((32, 1))), batch_size=32)
    >>> kerasflow.plan(graph, "cpu-testbed:4", verbose=0).predicted_step_time > 0
    True
"""

from kerasflow.profiling.capture import CapturedStep, capture_step
from kerasflow.profiling.estimate import estimate_costs
from kerasflow.profiling.links import LinkMeasurement, cluster_of, copy_bandwidth, measure_links
from kerasflow.profiling.profiler import profile_model
from kerasflow.profiling.splittable import NOT_SPLITTABLE_LAYERS, SPLITTABLE_LAYERS, is_splittable
from kerasflow.profiling.xplane import StepProfiler, attribute

__all__ = [
    "profile_model", "capture_step", "CapturedStep", "StepProfiler", "attribute",
    "estimate_costs", "measure_links", "LinkMeasurement", "cluster_of", "copy_bandwidth",
    "is_splittable", "SPLITTABLE_LAYERS", "NOT_SPLITTABLE_LAYERS",
]
