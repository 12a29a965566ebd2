"""``RecordedInputs``: the training step's inputs as ``fit`` fed them, kept to profile and check a plan with.

The recording step (``PlannedStep`` before a plan) reports each trace's input signature and each
batch it runs on; this object keeps the fully shaped signature over a relaxed one (a partial
last batch traces with an unknown batch size) and the largest real batch.
"""

from __future__ import annotations

import tensorflow as tf

from kerasflow.planner.errors import KerasflowError

__all__ = ["RecordedInputs"]


class RecordedInputs:
    """The step's input signature and a real batch of the user's data (see the module docstring).

    Example:
        >>> inputs = RecordedInputs()
        >>> inputs.on_batch((tf.ones([4, 2]), tf.ones([4])))
        >>> inputs.on_batch((tf.ones([1, 2]), tf.ones([1])))  # a partial last batch: not kept
        >>> [t.shape[0] for t in inputs.tensors()]
        [4, 4]
    """

    def __init__(self):
        self.spec = None
        self.batch = None
        self.stopped = False
        self._spec_full = False

    def on_trace(self, data) -> None:
        """Takes the signature of a trace of the step."""
        spec = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype) if isinstance(t, tf.Tensor) else t,
                                     data)
        full = all(s.shape.is_fully_defined() for s in tf.nest.flatten(spec) if isinstance(s, tf.TensorSpec))
        if full and not self._spec_full:
            self.spec, self._spec_full = spec, True
        elif self.spec is None:
            self.spec = spec

    def on_batch(self, batch) -> None:
        """Keeps the largest batch the step has run on (a copy), until ``stop``."""
        if self.stopped:
            return
        if self.batch is None or _batch_size(batch) > _batch_size(self.batch):
            self.batch = tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, batch)

    def stop(self) -> None:
        """No more batches are kept: the step stays traced as it is, and its recording costs a call."""
        self.stopped = True

    @property
    def traced(self) -> bool:
        """True once the step was traced."""
        return self.spec is not None

    def tensors(self):
        """The recorded batch as tensors, else zeros shaped like the traced step's inputs.

        Raises:
            KerasflowError: nothing was recorded, or the inputs' shapes are not all known.
        """
        if self.batch is not None:
            return tf.nest.map_structure(tf.convert_to_tensor, self.batch)
        if self.spec is None:
            raise KerasflowError("the training step was never traced, so its inputs are unknown")

        def zeros(spec):
            if not isinstance(spec, tf.TensorSpec):
                return spec
            if not spec.shape.is_fully_defined():
                raise KerasflowError(f"no batch of the data was recorded and the step's inputs have unknown "
                                     f"dimensions {spec.shape}; give the data as tf.Tensor inputs")
            return tf.zeros(spec.shape, spec.dtype)

        return tf.nest.map_structure(zeros, self.spec)


def _batch_size(batch) -> int:
    first = next((t for t in tf.nest.flatten(batch) if hasattr(t, "shape") and len(t.shape)), None)
    return int(first.shape[0]) if first is not None else 0
