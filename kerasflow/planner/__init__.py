"""kerasflow's pure-Python planning core: the IR, clusters, plans, the simulator, baselines.

Nothing in this package imports TensorFlow or Keras (a test enforces it), so plans can be
computed and inspected on any machine.

Example:
    >>> from kerasflow.planner import Cluster, synthetic, baselines
    >>> graph = synthetic.inception_like(blocks=1)
    >>> plan = baselines.data_parallel(graph, Cluster.preset("4xV100-nvlink"))
    >>> plan.predicted_step_time > 0
    True
"""

from . import baselines, costmodel, hardware, synthetic
from .cpop import cpop
from .heft import heft
from .baselines import (
    LowerBound,
    data_parallel,
    layerwise_model_parallel,
    lower_bound,
    single_device,
)
from .cluster import Cluster, Device, Link
from .errors import (
    ClusterConnectionError,
    FileFormatError,
    InvalidClusterError,
    InvalidGraphError,
    InsufficientMemoryError,
    InvalidPlanError,
    ProfilingError,
    KerasflowError,
    SimulationError,
)
from .graph import PHASES, Affine, Edge, Op, OpGraph
from .plan import DataParallel, Plan, Shard, Waves
from .simulator import Collective, SimulationResult, Transfer, simulate

# Imported last: binds ``kerasflow.planner.plan`` to the function (the module stays
# importable as ``kerasflow.planner.plan`` through sys.modules for ``Plan``).
from .planning import plan, ranked_plans  # noqa: E402
from .onecopy import one_copy_data_parallel  # noqa: E402
from .bounds import StepTimeBound, step_time_bound  # noqa: E402
from .rerank import rerank  # noqa: E402

__all__ = [
    "Affine", "Op", "Edge", "OpGraph", "PHASES",
    "Device", "Link", "Cluster",
    "Shard", "Waves", "DataParallel", "Plan",
    "simulate", "SimulationResult", "Transfer", "Collective",
    "plan", "ranked_plans", "rerank", "heft", "cpop",
    "single_device", "data_parallel", "one_copy_data_parallel", "layerwise_model_parallel", "lower_bound", "LowerBound",
    "step_time_bound", "StepTimeBound",
    "KerasflowError", "InvalidGraphError", "InvalidClusterError", "InvalidPlanError",
    "FileFormatError", "SimulationError", "InsufficientMemoryError", "ProfilingError",
    "ClusterConnectionError",
    "baselines", "costmodel", "hardware", "synthetic",
]
