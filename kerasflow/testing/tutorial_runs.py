"""A tutorial model trained by plain Keras or through a kerasflow door, and what users read compared with plain Keras'.

The compatibility suite (``tests/compat``) and the benchmarks that run its checks
(``benchmarks/compat_every_plan.py``, ``benchmarks/compat_table.py``) train the patterns of
``kerasflow.testing.tutorial_models`` this way: ``train`` one from seed 7 through a door
(``"strategy"``: under ``FastTStrategy``; ``"callback"``: with the ``FastT`` callback; None:
plain Keras), then hold its history and predictions to ``plain_keras``'s with
``assert_like_plain_keras`` (tolerances: ``kerasflow.testing.rounding``).

Example:
    >>> from kerasflow.testing.tutorial_models import PATTERNS
    >>> mlp = next(p for p in PATTERNS if p.name == "dropout_mlp")
    >>> args, kwargs = fit_arguments(mlp)
    >>> [a.shape for a in args], kwargs["validation_split"]
    ([(200, 20), (200,)], 0.2)
"""

from __future__ import annotations

import functools

import keras
import numpy as np

import kerasflow
from kerasflow.planner.errors import KerasflowError
from kerasflow.testing.rounding import RESOLUTION_STEPS, Spread, permuted_rows, resolution
from kerasflow.testing.tutorial_models import PATTERNS, Pattern

__all__ = ["SUITE_OPTIONS", "ROUNDING_FOLLOWER_ATOL", "fit_arguments", "train", "plain_keras", "predictions_of",
           "inference_kwargs", "assert_like_plain_keras", "kerasflow_warnings", "flat_outputs"]

# The doors' options the suite trains with: quiet, and one profiled step, which keeps it short
# (the default, 3, only takes medians of more).
SUITE_OPTIONS = {"verbose": 0, "profile_steps": 1}
# Ten times plain Keras' own spread for a pattern whose predictions follow rounding (Pattern).
ROUNDING_FOLLOWER_ATOL = 5e-3
DOORS = (None, "strategy", "callback")


def fit_arguments(pattern: Pattern, rows_permuted: bool = False):
    """``fit``'s data arguments and keywords for ``pattern``; ``rows_permuted``: each batch's rows
    permuted (the same sums in another order: ``rounding.permuted_rows``)."""
    data = pattern.data()
    if rows_permuted:
        data = permuted_rows(data, pattern.fit_kwargs.get("batch_size", 32))
    kwargs = dict(pattern.fit_kwargs)
    if isinstance(data, tuple):
        if len(data) == 3:
            kwargs["sample_weight"] = data[2]
        return data[:2], kwargs
    return (data,), kwargs


def train(pattern: Pattern, door: str | None = None, epochs: int = 1, rows_permuted: bool = False, **options):
    """Trains ``pattern`` from seed 7 through ``door`` and returns ``(model, loss history,
    predictions, the door's object)``.

    Args:
        pattern: a ``tutorial_models.Pattern``.
        door: None (plain Keras: the default strategy), ``"strategy"`` (under
            ``FastTStrategy(**options)``) or ``"callback"`` (with ``FastT(**options)``).
        epochs: epochs of ``fit``.
        rows_permuted: trained on each batch's rows permuted (predicted as given).
        **options: the door's keyword arguments, over ``SUITE_OPTIONS``.

    Raises:
        KerasflowError: ``door`` is none of these.

    Example:
        >>> train(PATTERNS[0], door="mirrored")
        Traceback (most recent call last):
        ...
        kerasflow.planner.errors.KerasflowError: door must be None, "strategy" or "callback". Received: door='mirrored'
    """
    if door not in DOORS:
        raise KerasflowError(f'door must be None, "strategy" or "callback". Received: door={door!r}')
    # The seed first: a tf.data shuffle with an op seed also takes the global seed when it is
    # made, so data made before it was set came in another order in a process's first run.
    keras.utils.set_random_seed(7)
    args, kwargs = fit_arguments(pattern, rows_permuted)
    options = {**SUITE_OPTIONS, **options}
    handle = None
    if door == "strategy":
        handle = kerasflow.FastTStrategy(**options)
        with handle.scope():
            model = pattern.build()
            if not pattern.callable:
                # Keras builds a model without call() under no tf.distribute strategy; the
                # strategy's error says to do this (its sub-models are built).
                model.built = True
    else:
        model = pattern.build()
        if door == "callback":
            handle = kerasflow.callbacks.FastT(**options)
            kwargs["callbacks"] = [handle]
    history = model.fit(*args, epochs=epochs, verbose=0, shuffle=False, **kwargs)
    return model, history.history, predictions_of(pattern, model), handle


def inference_kwargs(pattern: Pattern) -> dict:
    """``predict``'s and ``evaluate``'s batch: a model that takes only its own batch size gets it."""
    return {"batch_size": pattern.fit_kwargs["batch_size"]} if pattern.one_batch_size else {}


def predictions_of(pattern: Pattern, model):
    """``model``'s predictions of ``pattern``'s inputs as one array (None for a model without
    ``call()``)."""
    if not pattern.callable:
        return None
    args, _ = fit_arguments(pattern)
    return flat_outputs(model.predict(args[0] if len(args) == 2 else args[0].take(2), verbose=0,
                                      **inference_kwargs(pattern)))


@functools.lru_cache(maxsize=None)
def plain_keras(name: str, epochs: int = 1) -> tuple:
    """``(loss history, predictions)`` of the pattern named ``name`` trained by plain Keras (once
    a process)."""
    pattern = next(p for p in PATTERNS if p.name == name)
    _, history, predictions, _ = train(pattern, None, epochs)
    return history, predictions


def assert_like_plain_keras(history: dict, predictions, expected: tuple, epochs: int | None = None,
                            predictions_follow_rounding: bool = False, dtype: str = "float32",
                            spread: Spread | None = None) -> None:
    """Every loss and metric of every epoch (validation ones too; of the first ``epochs`` only,
    the rest finite) and the predictions (unless ``epochs`` is given), to 1e-5; predictions
    computed in half precision (``dtype``, the model's narrowest compute type) to that type's
    resolution at their magnitude, predictions that follow rounding to
    ``ROUNDING_FOLLOWER_ATOL``; everything to ``spread``'s bound when given (a plan that sums in
    another order ran: ``kerasflow/testing/rounding.py``), or, for a model computing in half
    precision, to that type's resolution: its replicas or shards round their partial sums to it,
    which permuted rows, summed whole before they are rounded, do not show.

    Example:
        >>> assert_like_plain_keras({"loss": [0.5]}, None, ({"loss": [0.5000001]}, None))
    """
    plain_history, plain_predictions = expected
    assert sorted(history) == sorted(plain_history)

    def reordered_within(actual, wanted, name: str) -> bool:
        wanted = np.asarray(wanted, "float64")
        largest = np.max(np.abs(wanted), initial=0.0)  # the output's magnitude, as Spread scales its bound
        return spread.within(actual, wanted, name) or (
            dtype != "float32" and bool(np.all(np.abs(actual - wanted) <= resolution(largest, dtype))))

    for key in plain_history:
        actual, wanted = np.asarray(history[key][:epochs]), np.asarray(plain_history[key][:epochs])
        if spread is not None:
            assert reordered_within(actual, wanted, key), f"{key}: {actual} != {wanted} ({spread.describe(key)})"
        else:
            np.testing.assert_allclose(actual, wanted, rtol=1e-5, atol=1e-7, err_msg=key)
        assert np.all(np.isfinite(history[key])), key
    if plain_predictions is None or epochs is not None:
        return
    if spread is not None:
        assert reordered_within(predictions, plain_predictions, "predictions"), spread.describe("predictions")
    elif predictions_follow_rounding:
        np.testing.assert_allclose(predictions, plain_predictions, rtol=1e-5, atol=ROUNDING_FOLLOWER_ATOL)
    elif dtype != "float32":
        apart = np.abs(predictions.astype("float64") - plain_predictions)
        allowed = resolution(plain_predictions, dtype)
        assert np.all(apart <= allowed), (f"{int(np.sum(apart > allowed))} of {apart.size} predictions differ by more "
                                          f"than {RESOLUTION_STEPS} {dtype} steps (largest gap {apart.max():.3g})")
    else:
        np.testing.assert_allclose(predictions, plain_predictions, rtol=1e-5, atol=1e-6)


def kerasflow_warnings(caught) -> list[str]:
    """The messages of the warnings in ``caught`` (``warnings.catch_warnings(record=True)``) that
    kerasflow gave.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warnings.warn("kerasflow: the plan measured slower")
        ...     warnings.warn("something else")
        >>> kerasflow_warnings(caught)
        ['kerasflow: the plan measured slower']
    """
    return [str(w.message) for w in caught if str(w.message).startswith("kerasflow:")]


def flat_outputs(outputs) -> np.ndarray:
    """One array of a model's outputs (a tensor, a list of them or a dict).

    Example:
        >>> flat_outputs({"a": np.ones((2, 1)), "b": np.zeros(2)}).tolist()
        [1.0, 1.0, 0.0, 0.0]
    """
    parts = outputs.values() if isinstance(outputs, dict) else outputs if isinstance(outputs, (list, tuple)) \
        else [outputs]
    return np.concatenate([np.ravel(part) for part in parts])
