"""How far a kerasflow output may be from plain Keras': bounds measured in the same run, never tuned on one processor.

Machines of one kind differ in processor, and Eigen and oneDNN choose how they block a sum (so
the order of its additions) from it: the same model rounds differently on another machine. So
an equality test's tolerance follows what kerasflow changes (``../shared/DESIGN.md``, "Tests that
hold on every machine"):

- A placement-only plan adds no sum in another order and runs plain Keras' kernels (fused chains
  stay whole: ``planner.ir.graphtables.FUSED_GROUP``): its variables equal plain Keras' bit for bit,
  its other outputs are held to the suite's tight constants.
- A plan that sums in another order (replicas, shards, split BatchNormalization statistics) is
  held to ``REORDERING_FACTOR`` times plain Keras' own spread under a reordering of the same sums,
  measured in the same test on the same machine (``Spread``): plain Keras trained again with
  each training batch's rows permuted (``permuted_rows``), the same math summed in another order.
- An output computed in float16 or bfloat16 is held to ``RESOLUTION_STEPS`` of that type's
  spacing at the output's magnitude (``resolution``).

A failure message names the bound and the figures behind it (``Spread.describe``): see
docs/developing.md, "When an equality test fails".
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

__all__ = ["FLOAT32_FLOOR", "REORDERING_FACTOR", "RESOLUTION_STEPS", "Spread", "compute_dtype", "permuted_rows",
           "resolution"]

# A plan's reordering and permuted rows are two draws of one kind of rounding. Measured on this
# project's machine in both arithmetics (oneDNN's kernels on and off), the farthest output of
# every reordering test came 0.0002 to 1.9 times plain Keras' spread under permuted rows
# (docs/developing.md, "When an equality test fails"); ten times it leaves a processor that
# blocks its sums otherwise five times that room, while a replica's gradients or a shard's
# statistics left out of their sum fail these tests (tools/mutations.py checks that).
REORDERING_FACTOR = 10.0
# Eight float32 steps (eps 1.19e-7): the least relative spread any reordering is allowed.
FLOAT32_FLOOR = 8 * float(np.finfo(np.float32).eps)
# Two steps of a half-precision type: one rounding of the output and one of the input it came from.
RESOLUTION_STEPS = 2


def permuted_rows(data, batch_size: int | None = None):
    """The same training data with each batch's rows reordered, its even rows first, then its odd
    ones: the same sums, added in another order. (Reversing the rows would not do: a sum taken as
    a balanced tree adds the same pairs in a mirrored tree, and rounds the same.) A model with
    random layers draws its numbers by row, so this changes its math: use it only for models
    without them.

    Args:
        data: a batched ``tf.data.Dataset`` (of tensors or tuples of them), or an array (or a
            list or tuple of arrays, a dict of them) whose rows ``fit`` batches by ``batch_size``.
        batch_size: the rows of a batch, for arrays.

    Returns:
        A new dataset, or new arrays; ``data`` is not changed.

    Example:
        >>> permuted_rows(np.arange(7), batch_size=4).tolist()
        [0, 2, 1, 3, 4, 6, 5]
    """
    if hasattr(data, "map"):  # a tf.data.Dataset
        import tensorflow as tf

        def permute(*parts):
            moved = tf.nest.map_structure(lambda t: tf.concat([t[0::2], t[1::2]], axis=0), parts)
            return moved if len(parts) > 1 else moved[0]

        return data.map(permute)
    if isinstance(data, dict):
        return {key: permuted_rows(value, batch_size) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(permuted_rows(value, batch_size) for value in data)
    if batch_size is None:
        raise ValueError("permuted_rows needs batch_size for arrays. Received: batch_size=None")
    array = np.asarray(data)
    order = []
    for start in range(0, len(array), batch_size):
        rows = np.arange(start, min(start + batch_size, len(array)))
        order += [*rows[0::2], *rows[1::2]]
    return array[np.asarray(order, dtype=int)]


def _largest(value) -> float:
    return float(np.max(np.abs(np.asarray(value, dtype="float64")), initial=0.0))


def _gap(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, dtype="float64") - np.asarray(b, dtype="float64")), initial=0.0))


@dataclasses.dataclass(frozen=True)
class Spread:
    """Plain Keras' own spread under a reordering: how far each of its outputs moves when each
    batch's rows come permuted (``permuted_rows``), relative to the output's largest value.

    An output is allowed ``REORDERING_FACTOR`` times its own spread, and never less than that
    factor times the spread of the run's losses (an output that happened to round alike in the
    two runs still follows the run's rounding), nor less than ``FLOAT32_FLOOR``. Outputs differ
    widely in how far rounding moves them: an optimizer's moments of a weight whose gradient is
    nearly 0 move by percents, losses by millionths.

    Attributes:
        own: each output's own relative spread.
        losses: the largest spread of a loss (an output named ``...loss``): the run's rounding.

    Example:
        >>> spread = Spread.between({"loss": [1.0, 0.5], "m": [0.1, 0.0]}, {"loss": [1.0, 0.500001], "m": [0.11, 0.0]})
        >>> round(spread.losses, 9), round(spread.own["m"], 9)
        (1e-06, 0.1)
        >>> round(spread.tolerance([1.0, 0.5], "loss"), 9)  # ten times the spread, times the largest value
        1e-05
        >>> spread.within([0.15, 0.0], [0.1, 0.0], "m"), spread.within([1.0, 0.4], [1.0, 0.5], "loss")
        (True, False)
    """

    own: Mapping[str, float]
    losses: float

    @classmethod
    def between(cls, plain: Mapping[str, object], reordered: Mapping[str, object]) -> "Spread":
        """The spread between two runs' outputs (name -> value), over the names both have."""
        own = {}
        for name, value in plain.items():
            scale = _largest(value)
            if name in reordered and np.shape(value) == np.shape(reordered[name]) and scale > 0:
                own[name] = _gap(value, reordered[name]) / scale
        return cls(own, max((gap for name, gap in own.items() if name.split(".")[-1].endswith("loss")), default=0.0))

    def bound(self, name: str) -> float:
        """The relative difference allowed for output ``name`` (see the class docstring)."""
        return max(REORDERING_FACTOR * max(self.own.get(name, 0.0), self.losses), FLOAT32_FLOOR)

    def tolerance(self, expected, name: str) -> float:
        """The absolute difference allowed for output ``name`` whose plain-Keras value is ``expected``."""
        return self.bound(name) * _largest(expected)

    def within(self, actual, expected, name: str) -> bool:
        """Whether ``actual`` is within the bound of ``expected`` (shapes equal)."""
        return np.shape(actual) == np.shape(expected) and _gap(actual, expected) <= self.tolerance(expected, name)

    def describe(self, name: str) -> str:
        """Output ``name``'s bound and the figures it comes from, for a failure message."""
        return (f"{name}'s bound {self.bound(name):.3g} of its largest value: {REORDERING_FACTOR:g} x plain Keras' own "
                f"spread under permuted rows, {self.own.get(name, 0.0):.3g} there, {self.losses:.3g} on the losses")


def resolution(expected, dtype: str, steps: int = RESOLUTION_STEPS) -> np.ndarray:
    """``steps`` spacings of ``dtype`` at each value's magnitude: how far two runs computing in
    that type may round apart.

    Args:
        expected: plain Keras' values.
        dtype: the type the values were computed in (``"float16"``, ``"bfloat16"``, ``"float32"``).
        steps: how many spacings.

    Example:
        >>> float(resolution(np.float32(0.26), "float16")[()])  # float16's spacing at 0.26 is 2**-12
        0.00048828125
    """
    values = np.abs(np.asarray(expected, dtype="float64"))
    if dtype == "bfloat16":  # 8 significant bits: float32's exponent, float32's spacing times 2**16
        return steps * np.spacing(values.astype(np.float32)).astype("float64") * 2.0 ** 16
    return steps * np.spacing(values.astype(np.dtype(dtype))).astype("float64")


def compute_dtype(model) -> str:
    """The narrowest type a layer of ``model`` computes in (``"float32"`` when none is narrower):
    a mixed-precision model's float32 outputs still carry its float16 activations' rounding.

    Example:
        >>> import keras
        >>> dense = keras.layers.Dense(1, dtype="mixed_float16")
        >>> compute_dtype(keras.Sequential([keras.Input((2,)), dense]))
        'float16'
    """
    narrowest = "float32"
    for layer in model._flatten_layers():
        policy = getattr(layer, "dtype_policy", None)
        dtype = getattr(policy, "compute_dtype", None)
        if dtype in ("float16", "bfloat16"):
            narrowest = dtype
    return narrowest
