"""``first_step_recorder``: the partition graphs of ``fit``'s first step, to count plain Keras' fused kernels.

A plan must not cost the step the kernels TensorFlow's graph optimizer fuses (a matmul or
convolution with its bias and activation): ``PlacementReport.fused_kernels`` counts a planned
step's, and this recorder gives what plain Keras' first step ran to compare it with
(``tests/strategies/test_fusions.py``, ``benchmarks/order_cost.py``,
``benchmarks/heldout_mobilenet.py``).
"""

from __future__ import annotations

__all__ = ["first_step_recorder"]


def first_step_recorder():
    """A Keras callback that keeps the partition graphs of ``fit``'s first step in its
    ``partition_graphs`` (TensorFlow records a function's when it instantiates it, which that
    step does): ``readback.fused_kernel_count`` counts the fused kernels plain Keras' step runs.

    Example:
        >>> import keras, numpy as np
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="relu")])
        >>> model.compile("sgd", "mse")
        >>> recorder = first_step_recorder()
        >>> _ = model.fit(np.ones((8, 4)), np.ones((8, 2)), batch_size=8, verbose=0, callbacks=[recorder])
        >>> len(recorder.partition_graphs) > 0  # readback.fused_kernel_count(recorder.partition_graphs)
        True
    """
    import keras

    from kerasflow.strategies.readback import start_recording, stop_recording

    class FirstStep(keras.callbacks.Callback):
        partition_graphs = None

        def on_train_batch_begin(self, batch, logs=None):
            if batch == 0:
                start_recording()

        def on_train_batch_end(self, batch, logs=None):
            if batch == 0:
                self.partition_graphs = stop_recording()

    return FirstStep()
