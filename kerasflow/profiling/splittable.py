"""Which Keras layers may be split along the batch (their samples are independent, their math unchanged).

Built-in layers are listed by class name. Two kinds are never split op by op, nor run as
waves: layers that couple the samples of a batch (BatchNormalization's statistics in
training) and random layers (Dropout, GaussianNoise, random augmentation): shards or waves
would each draw their own randomness, not their slice of the whole batch's, and the loss
would change. A Keras 3 BatchNormalization is split all the same, as a whole: the profile
lists it among the layers whose statistics copies compute together
(``planner.ir.graphtables.batch_statistics``), and its shards normalize with the whole batch's.
A custom layer opts in or out with a class or instance attribute ``kerasflow_splittable = True``
(or ``False``); unknown layers (``Lambda`` included: its code is unknown) are not split, the
safe default.

A compiled loss is split (or run as waves, or per replica) only when each shard's loss, weighted
by its share of the batch, sums to the whole batch's: every loss is a built-in one that scores
each sample alone (``SPLITTABLE_LOSSES``; not Dice, Tversky or Circle, which score the batch as
a whole) or opts in with ``kerasflow_splittable = True`` (on the loss object or the function
given to ``compile``), and averages over the batch, unmasked.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SPLITTABLE_LAYERS", "NOT_SPLITTABLE_LAYERS", "is_splittable", "ATTRIBUTE", "SPLITTABLE_LOSSES",
           "MEAN_REDUCTIONS", "is_splittable_loss", "losses_combine_by_share"]

ATTRIBUTE = "kerasflow_splittable"

SPLITTABLE_LAYERS = frozenset({
    "Dense", "EinsumDense", "Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose", "Conv2DTranspose",
    "Conv3DTranspose", "DepthwiseConv1D", "DepthwiseConv2D", "SeparableConv1D", "SeparableConv2D",
    "MaxPooling1D", "MaxPooling2D", "MaxPooling3D", "AveragePooling1D", "AveragePooling2D", "AveragePooling3D",
    "GlobalMaxPooling1D", "GlobalMaxPooling2D", "GlobalMaxPooling3D", "GlobalAveragePooling1D",
    "GlobalAveragePooling2D", "GlobalAveragePooling3D", "Activation", "ReLU", "LeakyReLU", "PReLU", "ELU",
    "Softmax", "Embedding", "LayerNormalization", "GroupNormalization", "UnitNormalization", "MultiHeadAttention",
    "Attention", "AdditiveAttention", "Flatten", "Reshape", "Permute", "RepeatVector", "Cropping1D",
    "Cropping2D", "ZeroPadding1D", "ZeroPadding2D", "UpSampling1D", "UpSampling2D", "Concatenate", "Add",
    "Subtract", "Multiply", "Average", "Maximum", "Minimum", "Dot", "Identity", "Rescaling", "InputLayer",
    "LSTM", "GRU", "SimpleRNN", "Bidirectional", "TimeDistributed",
})

NOT_SPLITTABLE_LAYERS = frozenset({
    # Statistics over the batch in training.
    "BatchNormalization", "SyncBatchNormalization",
    # Random: each shard or wave would draw its own numbers.
    "Dropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D", "AlphaDropout", "GaussianNoise",
    "GaussianDropout", "RandomFlip", "RandomRotation", "RandomZoom", "RandomTranslation", "RandomContrast",
    "RandomCrop", "RandomBrightness", "RandomHeight", "RandomWidth",
})


def is_splittable(layer: Any) -> bool:
    """True when ``layer`` may run as shards of the batch with the same result.

    Example:
        >>> class Mine:
        ...     kerasflow_splittable = True
        >>> is_splittable(Mine())
        True
    """
    if layer is None:
        return False
    flag = getattr(layer, ATTRIBUTE, None)
    if flag is not None:
        return bool(flag)
    name = type(layer).__name__
    if name in NOT_SPLITTABLE_LAYERS:
        return False
    if getattr(layer, "stateful", False):  # a stateful RNN carries state across batches
        return False
    return name in SPLITTABLE_LAYERS


# Built-in losses that score each sample alone, as their functions are named (the classes wrap them).
SPLITTABLE_LOSSES = frozenset({
    "mean_squared_error", "mean_absolute_error", "mean_absolute_percentage_error", "mean_squared_logarithmic_error",
    "cosine_similarity", "huber", "log_cosh", "hinge", "squared_hinge", "categorical_hinge", "kl_divergence",
    "poisson", "binary_crossentropy", "binary_focal_crossentropy", "categorical_crossentropy",
    "categorical_focal_crossentropy", "categorical_generalized_cross_entropy", "sparse_categorical_crossentropy", "ctc",
})

# Reductions that average over the batch's elements: a shard's value times its share of the batch sums to the whole's.
MEAN_REDUCTIONS = frozenset({"sum_over_batch_size", "mean"})


def is_splittable_loss(loss: Any) -> bool:
    """True when ``loss`` (a Keras loss object) averages a score of each sample alone, so that
    shards' losses weighted by their share of the batch sum to the whole batch's.

    Example:
        >>> import keras
        >>> is_splittable_loss(keras.losses.SparseCategoricalCrossentropy())
        True
        >>> is_splittable_loss(keras.losses.MeanSquaredError(reduction="sum"))
        False
        >>> is_splittable_loss(keras.losses.Dice())
        False
    """
    if getattr(loss, "reduction", None) not in MEAN_REDUCTIONS:
        return False
    function = getattr(loss, "fn", None)  # the function a loss class (or ``compile(loss=fn)``) wraps
    flag = getattr(loss, ATTRIBUTE, getattr(function, ATTRIBUTE, None))
    if flag is not None:
        return bool(flag)
    return getattr(function, "__name__", None) in SPLITTABLE_LOSSES and getattr(function, "__module__", "").startswith(
        "keras.")


def losses_combine_by_share(losses: list, masked: bool) -> bool:
    """Whether shards of the batch, each computing the compiled loss of its rows, give the whole
    batch's loss when weighted by their share of it: there are ``losses`` (the compiled loss'
    objects, ``_compat.compiled_losses``), every one ``is_splittable_loss`` accepts, and
    (``masked``) no prediction they score carries a mask (a masked mean divides by the unmasked
    entries of the whole batch).

    Example:
        >>> import keras
        >>> losses_combine_by_share([keras.losses.MeanSquaredError()], masked=False)
        True
        >>> losses_combine_by_share([keras.losses.MeanSquaredError()], masked=True)
        False
        >>> losses_combine_by_share([], masked=False)  # none could be read
        False
    """
    return bool(losses) and not masked and all(is_splittable_loss(loss) for loss in losses)
