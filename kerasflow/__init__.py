"""kerasflow: fast Keras training on several devices, planned for you (FastT + Wavelet).

Importing ``kerasflow`` does not import TensorFlow; the TensorFlow-facing parts
(``kerasflow.profiling``, ``kerasflow.strategies``, ``kerasflow.callbacks``) load on
first use.

Example:
    >>> import kerasflow
    >>> graph = kerasflow.planner.ir.synthetic.chain_mlp(layers=2)
    >>> cluster = kerasflow.Cluster.preset("2xK80-pcie")
    >>> kerasflow.planner.simulate(graph, cluster, kerasflow.planner.single_device(graph, cluster)).makespan > 0
    True
"""

import importlib

from kerasflow import planner
from kerasflow._version import __version__
from kerasflow.planner import Cluster, OpGraph, Plan, plan
from kerasflow.planner import errors as _errors
from kerasflow.planner.errors import *  # noqa: F403 - the error classes, listed once: errors.__all__

__all__ = [
    "__version__",
    "planner",
    "profiling",
    "strategies",
    "callbacks",
    "devices",
    "multihost",
    "testbed",
    "FastTStrategy",
    "OpGraph",
    "Cluster",
    "Plan",
    "plan",
    *_errors.__all__,
]

_LAZY_SUBPACKAGES = ("profiling", "strategies", "callbacks", "devices", "multihost", "testbed")


def __getattr__(name):
    # TensorFlow takes seconds to import: load the TF-facing parts on first use only.
    if name in _LAZY_SUBPACKAGES:
        return importlib.import_module(f"kerasflow.{name}")
    if name == "FastTStrategy":
        return importlib.import_module("kerasflow.strategies").FastTStrategy
    raise AttributeError(f"module 'kerasflow' has no attribute {name!r}")
