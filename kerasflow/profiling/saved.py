"""Profiling a saved Keras model on synthetic data (what ``kerasflow profile`` runs)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from kerasflow.planner.errors import ProfilingError
from kerasflow.planner.ir.graph import OpGraph
from kerasflow.profiling.profiler import profile_model

__all__ = ["profile_saved_model", "synthetic_batch"]


def _shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.replace("x", ",").split(",") if part.strip())
    except ValueError:
        raise ProfilingError(f"--input-shape takes integers like 32,32,3; received {text!r}.") from None


def synthetic_batch(model, batch_size: int, input_shapes: Sequence[str] | None = None, seed: int = 0) -> tuple:
    """``(x, y)`` of random data shaped for ``model``'s inputs and outputs.

    Integer inputs (token ids) get small integers; targets match the outputs' shapes, or
    class indices when the loss is a sparse one.
    """
    rng = np.random.default_rng(seed)
    inputs = list(getattr(model, "inputs", None) or [])
    if input_shapes:
        shapes = [_shape(s) for s in input_shapes]
        if inputs and len(shapes) != len(inputs):
            raise ProfilingError(f"The model has {len(inputs)} input(s); received {len(shapes)} --input-shape.")
        dtypes = [getattr(i, "dtype", "float32") for i in inputs] or ["float32"] * len(shapes)
    elif inputs:
        shapes = [tuple(i.shape[1:]) for i in inputs]
        if any(d is None for shape in shapes for d in shape):
            raise ProfilingError(f"The model's inputs have unknown dimensions {shapes}; pass --input-shape.")
        dtypes = [i.dtype for i in inputs]
    else:
        raise ProfilingError("The model does not declare its inputs (a subclassed model?); pass --input-shape.")
    xs = []
    for shape, dtype in zip(shapes, dtypes):
        name = str(dtype)
        if "int" in name:
            xs.append(rng.integers(0, 10, (batch_size,) + shape).astype(name.replace("tf.", "")))
        else:
            xs.append(rng.random((batch_size,) + shape, dtype=np.float32))
    outputs = model(xs if len(xs) > 1 else xs[0])
    loss = str(getattr(model, "loss", "") or "")
    flat = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    ys = []
    for out in flat:
        if "sparse" in loss.lower() or "Sparse" in loss:
            ys.append(rng.integers(0, int(out.shape[-1]), (batch_size,) + tuple(out.shape[1:-1])))
        else:
            ys.append(rng.random((batch_size,) + tuple(out.shape[1:]), dtype=np.float32))
    x = xs if len(xs) > 1 else xs[0]
    y = ys if len(ys) > 1 else ys[0]
    return x, y


def profile_saved_model(path: str, *, batch_size: int, input_shapes: Sequence[str] | None = None,
                        steps: int = 3) -> OpGraph:
    """Loads a saved model (with its compile settings) and profiles it on synthetic data.

    Raises:
        ProfilingError: the file cannot be loaded, or the model was saved uncompiled.
    """
    import keras

    try:
        model = keras.models.load_model(path)
    except (OSError, ValueError) as error:
        raise ProfilingError(f"Cannot load a Keras model from {path!r}: {error}") from None
    x, y = synthetic_batch(model, batch_size, input_shapes)
    return profile_model(model, (x, y), batch_size=batch_size, steps=steps)
