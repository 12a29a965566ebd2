"""The exceptions kerasflow raises for bad input: all are ``ValueError`` subclasses."""

from __future__ import annotations

# The one list of the error classes: ``kerasflow`` and ``kerasflow.planner`` export these.
__all__ = ["KerasflowError", "InvalidGraphError", "InvalidClusterError", "InvalidPlanError", "FileFormatError",
           "SimulationError", "InsufficientMemoryError", "ProfilingError", "ClusterConnectionError"]


class KerasflowError(ValueError):
    """Base class of every input error kerasflow raises.

    Catch this one class to handle any malformed graph, cluster, plan or file.

    Example:
        >>> import kerasflow
        >>> try:
        ...     kerasflow.Cluster.preset("no-such-preset")
        ... except kerasflow.KerasflowError as error:
        ...     print(type(error).__name__)
        InvalidClusterError
    """


class InvalidGraphError(KerasflowError):
    """An ``OpGraph`` is malformed: a cycle, an unknown endpoint, a bad number.

    Example:
        >>> from kerasflow.planner import OpGraph, Op, Edge
        >>> try:
        ...     OpGraph([Op("a", cost={"CPU": -1.0})], [])
        ... except InvalidGraphError as error:
        ...     print("negative" in str(error))
        True
    """


class InvalidClusterError(KerasflowError):
    """A ``Cluster`` is malformed or names something that does not exist.

    Example:
        >>> from kerasflow.planner import Cluster
        >>> try:
        ...     Cluster.preset("3xTPU")
        ... except InvalidClusterError as error:
        ...     print("kerasflow clusters" in str(error))
        True
    """


class InvalidPlanError(KerasflowError):
    """A ``Plan`` does not fit its graph or cluster (unknown op or device, bad order).

    Example:
        >>> from kerasflow.planner import Plan, Cluster, synthetic
        >>> graph = synthetic.chain_mlp(layers=2)
        >>> try:
        ...     Plan(placement={op.name: "/GPU:9" for op in graph.ops}).validate(
        ...         graph, Cluster.preset("2xK80-pcie"))
        ... except InvalidPlanError as error:
        ...     print("/GPU:9" in str(error))
        True
    """


class FileFormatError(KerasflowError):
    """A JSON file kerasflow reads is unreadable, of the wrong kind, or of another version.

    Example:
        >>> from kerasflow.planner import OpGraph
        >>> try:
        ...     OpGraph.load("/nonexistent/profile.json")
        ... except FileFormatError as error:
        ...     print("profile.json" in str(error))
        True
    """


class SimulationError(KerasflowError):
    """A plan cannot be replayed: its device orders deadlock against the data flow.

    Example:
        >>> issubclass(SimulationError, ValueError)
        True
    """


class InsufficientMemoryError(KerasflowError):
    """No plan fits the devices' memory; the message says what was needed and the ways out.

    Example:
        >>> issubclass(InsufficientMemoryError, KerasflowError)
        True
    """


class ProfilingError(KerasflowError):
    """A model or its data cannot be profiled (not compiled, wrong data, XLA on).

    Example:
        >>> issubclass(ProfilingError, ValueError)
        True
    """


class ClusterConnectionError(KerasflowError):
    """A task of a multi-host cluster cannot be reached (names the task, its address, what to check).

    Example:
        >>> issubclass(ClusterConnectionError, KerasflowError)
        True
    """
