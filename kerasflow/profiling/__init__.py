"""kerasflow.profiling: a live Keras training step as an ``OpGraph`` with measured costs.

Example:
    >>> graph = kerasflow.profiling.profile_model(model, (x, y), batch_size=64)  # doctest: +SKIP
    >>> kerasflow.plan(graph, "cpu-testbed:4")  # doctest: +SKIP
"""

from kerasflow.profiling.capture import CapturedStep, capture_step
from kerasflow.profiling.estimate import estimate_costs
from kerasflow.profiling.links import LinkMeasurement, cluster_of, measure_links
from kerasflow.profiling.profiler import profile_model
from kerasflow.profiling.splittable import NOT_SPLITTABLE_LAYERS, SPLITTABLE_LAYERS, is_splittable
from kerasflow.profiling.xplane import StepProfiler, attribute

__all__ = [
    "profile_model", "capture_step", "CapturedStep", "StepProfiler", "attribute",
    "estimate_costs", "measure_links", "LinkMeasurement", "cluster_of",
    "is_splittable", "SPLITTABLE_LAYERS", "NOT_SPLITTABLE_LAYERS",
]
