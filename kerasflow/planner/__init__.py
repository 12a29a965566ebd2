"""kerasflow's pure-Python planning core: the IR, clusters, plans, the simulator, the planners.

Nothing in this package imports TensorFlow or Keras (a test enforces it), so plans can be
computed and inspected on any machine. Its modules stand on five floors; a module imports
only from its own floor and those below (``tests/planner/test_floors.py`` enforces it):

1. ``ir``: what is planned and what a plan says: the op graph and its tables, clusters,
   machines, hardware, cost models, ``Plan``, synthetic graphs.
2. ``sim``: what a plan costs: the task graph a plan makes, the event-driven simulator,
   the ring all-reduce's price, ``with_prediction``, text reports.
3. ``schedule``: list scheduling: ranks, HEFT, CPOP.
4. ``parallel``: the parallel forms: baselines (data parallelism among them), Tick-Tock
   waves and pipelines, one-copy data parallelism, critical-path splits.
5. ``search``: choosing among them: ``plan``/``ranked_plans`` of a ``PlanRequest``, the
   largest batch, bounds, re-ranking by measurement.

Beneath them, shared by all: ``errors``, ``_jsonio``, ``_gc``. One lazy import runs up: a
``Plan``'s ``validate`` and ``summary`` simulate it (``ir`` reaching ``sim``), at call time.

Example:
    >>> from kerasflow.planner import Cluster, synthetic, baselines
    >>> graph = synthetic.inception_like(blocks=1)
    >>> plan = baselines.data_parallel(graph, Cluster.preset("4xV100-nvlink"))
    >>> plan.predicted_step_time > 0
    True
"""

from . import errors
from .errors import *  # noqa: F403 - the error classes, listed once: errors.__all__
from .ir import costmodel, hardware, synthetic
from .ir.cluster import Cluster, Device, Link
from .ir.graph import PHASES, Affine, Edge, Op, OpGraph
from .ir.plan import DataParallel, Plan, Shard, Waves
from .sim.simulator import Collective, SimulationResult, Transfer, simulate
from .schedule.cpop import cpop
from .schedule.heft import heft
from .parallel import baselines
from .parallel.baselines import data_parallel, layerwise_model_parallel, single_device
from .parallel.onecopy import one_copy_data_parallel
from .search.bounds import LowerBound, StepTimeBound, lower_bound, step_time_bound
from .search.candidates import Misfit
from .search.planning import plan, ranked_plans
from .search.request import PlanRequest
from .search.rerank import rerank

__all__ = [
    "Affine", "Op", "Edge", "OpGraph", "PHASES",
    "Device", "Link", "Cluster",
    "Shard", "Waves", "DataParallel", "Plan",
    "simulate", "SimulationResult", "Transfer", "Collective",
    "plan", "ranked_plans", "PlanRequest", "Misfit", "rerank", "heft", "cpop",
    "single_device", "data_parallel", "one_copy_data_parallel", "layerwise_model_parallel", "lower_bound", "LowerBound",
    "step_time_bound", "StepTimeBound",
    *errors.__all__,
    "baselines", "costmodel", "hardware", "synthetic",
]
