"""Keras models written the way the keras.io examples write them, on synthetic data of the same shapes.

Each pattern is a ``Pattern``: ``build()`` returns a compiled model (called under whatever
strategy scope the test opens), ``data()`` returns what the tutorial passes to ``fit`` (a
``tf.data`` pipeline with its partial last batch, or arrays) and ``fit_kwargs`` the rest of
its ``fit`` call. Nothing here knows kerasflow: these are the models a new user brings, and
nothing is downloaded. The compatibility suite (``tests/compat``) trains every one plainly and
through kerasflow (``kerasflow.testing.tutorial_runs``); docs/what-kerasflow-plans.md tabulates them.

Example:
    >>> from kerasflow.testing.tutorial_models import PATTERNS
    >>> mlp = next(p for p in PATTERNS if p.name == "dropout_mlp")
    >>> x, y = mlp.data()
    >>> x.shape, mlp.build().count_params()
    ((200, 20), 6154)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf
from keras import layers, ops

__all__ = ["Pattern", "PATTERNS", "SAMPLES", "SWITCH_BATCH", "GAN", "VAE", "gan", "gan_dataset", "vae", "vae_data"]

SAMPLES = 200  # not a multiple of the batch: every pipeline ends in a partial batch


@dataclasses.dataclass
class Pattern:
    """One tutorial-style model: how to build it, its data, the rest of its ``fit`` call."""

    name: str
    build: Callable[[], keras.Model]
    data: Callable[[], Any]
    fit_kwargs: dict = dataclasses.field(default_factory=dict)
    layers: str = ""  # the layer types it exercises, for the docs table
    keras_file: bool = True  # plain Keras round-trips it through a .keras file (no custom objects)
    h5_file: bool = True  # ... and through a legacy .h5 file (lookup layers' tables are not restored)
    callable: bool = True  # it has call(), so evaluate and predict work
    callback_route: bool = True  # also trained through the FastT callback in the test suite
    # Plain Keras itself is not reproducible past rounding over a few epochs: reordering one
    # batch's rows (the same math) moves MobileNetV2's loss by percents within a few epochs
    # (docs/what-kerasflow-plans.md), so a longer run is compared with it over the first epoch only.
    amplifies_rounding: bool = False
    # Its predictions follow rounding though its losses do not: a convolution's bias ahead of
    # BatchNormalization has a gradient of zero in exact arithmetic, which Adam scales from
    # rounding noise to steps of its learning rate. Plain Keras with oneDNN's kernels and without
    # (TF_ENABLE_ONEDNN_OPTS=1 and 0, one process each) trains image_classifier to the same loss
    # in every digit, but predicts apart by up to the figure docs/what-kerasflow-plans.md gives,
    # so its predictions are compared to ten times that.
    predictions_follow_rounding: bool = False
    # It takes only the batch size it was built for (fit_kwargs["batch_size"]), in predict and
    # evaluate too.
    one_batch_size: bool = False


def _rng():
    return np.random.default_rng(0)


# 1. keras.io "Simple MNIST convnet": Sequential, Conv2D, MaxPooling2D, Flatten, Dropout; arrays.
def mnist_convnet():
    model = keras.Sequential([
        keras.Input(shape=(28, 28, 1)),
        layers.Conv2D(8, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Conv2D(16, kernel_size=(3, 3), activation="relu"),
        layers.MaxPooling2D(pool_size=(2, 2)),
        layers.Flatten(),
        layers.Dropout(0.5),
        layers.Dense(10, activation="softmax"),
    ])
    model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
    return model


def mnist_data():
    rng = _rng()
    x = rng.random((SAMPLES, 28, 28, 1), dtype=np.float32)
    y = keras.utils.to_categorical(rng.integers(0, 10, SAMPLES), 10)
    return x, y


# 2. keras.io "Image classification from scratch": tf.data pipeline (partial last batch),
#    augmentation layers, Rescaling, BatchNormalization, SeparableConv2D, residuals.
def image_classifier():
    inputs = keras.Input(shape=(32, 32, 3))
    x = layers.RandomFlip("horizontal")(inputs)
    x = layers.Rescaling(1.0 / 255)(x)
    x = layers.Conv2D(16, 3, strides=2, padding="same")(x)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)
    previous = x
    for size in (16, 32):
        x = layers.Activation("relu")(x)
        x = layers.SeparableConv2D(size, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
        residual = layers.Conv2D(size, 1, strides=2, padding="same")(previous)
        x = layers.add([x, residual])
        previous = x
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dropout(0.25)(x)
    outputs = layers.Dense(1, activation=None)(x)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(3e-4), loss=keras.losses.BinaryCrossentropy(from_logits=True),
                  metrics=[keras.metrics.BinaryAccuracy(name="acc")])
    return model


def image_dataset():
    rng = _rng()
    images = (rng.random((SAMPLES, 32, 32, 3)) * 255).astype("float32")
    labels = rng.integers(0, 2, (SAMPLES, 1)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((images, labels)).batch(16).prefetch(tf.data.AUTOTUNE)


# 3. keras.io "Text classification with Transformer": custom layers, MHA, LayerNorm, Dropout.
class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1, **kwargs):
        super().__init__(**kwargs)
        self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential([layers.Dense(ff_dim, activation="relu"), layers.Dense(embed_dim)])
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs):
        attn_output = self.att(inputs, inputs)
        attn_output = self.dropout1(attn_output)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.ffn(out1)
        ffn_output = self.dropout2(ffn_output)
        return self.layernorm2(out1 + ffn_output)


class TokenAndPositionEmbedding(layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim, **kwargs):
        super().__init__(**kwargs)
        self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        maxlen = ops.shape(x)[-1]
        positions = ops.arange(start=0, stop=maxlen, step=1)
        return self.token_emb(x) + self.pos_emb(positions)


MAXLEN, VOCAB = 20, 200


def text_transformer():
    inputs = layers.Input(shape=(MAXLEN,))
    x = TokenAndPositionEmbedding(MAXLEN, VOCAB, 16)(inputs)
    x = TransformerBlock(16, 2, 16)(x)
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.Dropout(0.1)(x)
    x = layers.Dense(8, activation="relu")(x)
    x = layers.Dropout(0.1)(x)
    outputs = layers.Dense(2, activation="softmax")(x)
    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def text_data():
    rng = _rng()
    return rng.integers(0, VOCAB, (SAMPLES, MAXLEN)), rng.integers(0, 2, SAMPLES)


# 4. keras.io "Timeseries forecasting for weather prediction": timeseries_dataset_from_array, LSTM.
def weather_lstm():
    inputs = keras.layers.Input(shape=(12, 7))
    lstm_out = keras.layers.LSTM(16)(inputs)
    outputs = keras.layers.Dense(1)(lstm_out)
    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=0.001), loss="mse")
    return model


def weather_dataset():
    rng = _rng()
    features = rng.random((SAMPLES + 12, 7), dtype=np.float32)
    return keras.utils.timeseries_dataset_from_array(features[:-12], features[12:, 1:2], sequence_length=12,
                                                     sampling_rate=1, batch_size=16)


# 5. keras.io "Structured data classification" / wide & deep: dict inputs, string and integer
#    features, StringLookup, IntegerLookup, Normalization, Hashing, CategoryEncoding.
def _structured_frame():
    rng = _rng()
    return {
        "age": rng.integers(18, 80, SAMPLES).astype("float32"),
        "thal": rng.choice(["fixed", "normal", "reversible"], SAMPLES),
        "sex": rng.integers(0, 2, SAMPLES).astype("int64"),
        "city": rng.choice([f"city{i}" for i in range(30)], SAMPLES),
    }, rng.integers(0, 2, SAMPLES).astype("float32")


def wide_and_deep():
    features, _ = _structured_frame()
    age = keras.Input(shape=(1,), name="age")
    thal = keras.Input(shape=(1,), name="thal", dtype="string")
    sex = keras.Input(shape=(1,), name="sex", dtype="int64")
    city = keras.Input(shape=(1,), name="city", dtype="string")
    normalizer = layers.Normalization()
    normalizer.adapt(features["age"].reshape(-1, 1))
    thal_lookup = layers.StringLookup(output_mode="one_hot")
    thal_lookup.adapt(features["thal"])
    sex_lookup = layers.IntegerLookup(output_mode="one_hot")
    sex_lookup.adapt(features["sex"])
    city_hash = layers.Hashing(num_bins=16)
    wide = layers.concatenate([normalizer(age), thal_lookup(thal), sex_lookup(sex),
                               layers.CategoryEncoding(16, output_mode="one_hot")(city_hash(city))])
    deep = layers.Embedding(16, 4)(city_hash(city))
    deep = layers.Flatten()(deep)
    deep = layers.Dense(16, activation="relu")(layers.concatenate([deep, normalizer(age)]))
    x = layers.concatenate([wide, deep])
    output = layers.Dense(1, activation="sigmoid")(x)
    model = keras.Model({"age": age, "thal": thal, "sex": sex, "city": city}, output)
    model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
    return model


def structured_dataset():
    features, labels = _structured_frame()
    features = {k: v.reshape(-1, 1) for k, v in features.items()}
    # Shuffled once, the same order every epoch: Keras under any tf.distribute strategy opens the
    # dataset once more before training (to build the model), which would reshuffle it.
    return (tf.data.Dataset.from_tensor_slices((features, labels))
            .shuffle(SAMPLES, seed=1, reshuffle_each_iteration=False).batch(32))


# 6. keras.io "Conditional GAN" / "DCGAN": custom train_step, two sub-models, two optimizers.
LATENT = 8


class GAN(keras.Model):
    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.seed_generator = keras.random.SeedGenerator(1337)

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn
        self.d_loss_metric = keras.metrics.Mean(name="d_loss")
        self.g_loss_metric = keras.metrics.Mean(name="g_loss")

    @property
    def metrics(self):
        return [self.d_loss_metric, self.g_loss_metric]

    def train_step(self, real_images):
        batch_size = ops.shape(real_images)[0]
        random_latent_vectors = keras.random.normal(shape=(batch_size, self.latent_dim), seed=self.seed_generator)
        generated_images = self.generator(random_latent_vectors)
        combined_images = ops.concatenate([generated_images, real_images], axis=0)
        labels = ops.concatenate([ops.ones((batch_size, 1)), ops.zeros((batch_size, 1))], axis=0)
        with tf.GradientTape() as tape:
            predictions = self.discriminator(combined_images)
            d_loss = self.loss_fn(labels, predictions)
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        random_latent_vectors = keras.random.normal(shape=(batch_size, self.latent_dim), seed=self.seed_generator)
        misleading_labels = ops.zeros((batch_size, 1))
        with tf.GradientTape() as tape:
            predictions = self.discriminator(self.generator(random_latent_vectors))
            g_loss = self.loss_fn(misleading_labels, predictions)
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        self.d_loss_metric.update_state(d_loss)
        self.g_loss_metric.update_state(g_loss)
        return {"d_loss": self.d_loss_metric.result(), "g_loss": self.g_loss_metric.result()}


def gan():
    discriminator = keras.Sequential([
        keras.Input(shape=(16, 16, 1)),
        layers.Conv2D(8, 3, strides=2, padding="same"), layers.LeakyReLU(negative_slope=0.2),
        layers.Conv2D(16, 3, strides=2, padding="same"), layers.LeakyReLU(negative_slope=0.2),
        layers.GlobalMaxPooling2D(), layers.Dense(1),
    ], name="discriminator")
    generator = keras.Sequential([
        keras.Input(shape=(LATENT,)),
        layers.Dense(4 * 4 * 16), layers.LeakyReLU(negative_slope=0.2), layers.Reshape((4, 4, 16)),
        layers.Conv2DTranspose(16, 4, strides=2, padding="same"), layers.LeakyReLU(negative_slope=0.2),
        layers.Conv2DTranspose(8, 4, strides=2, padding="same"), layers.LeakyReLU(negative_slope=0.2),
        layers.Conv2D(1, 5, padding="same", activation="sigmoid"),
    ], name="generator")
    model = GAN(discriminator=discriminator, generator=generator, latent_dim=LATENT)
    model.compile(d_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
                  g_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
                  loss_fn=keras.losses.BinaryCrossentropy(from_logits=True))
    return model


def gan_dataset():
    images = _rng().random((SAMPLES, 16, 16, 1), dtype=np.float32)
    return tf.data.Dataset.from_tensor_slices(images).batch(32)


# 7. keras.io "Variational AutoEncoder": no call(), a train_step over encoder and decoder.
class Sampling(layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator(1337)

    def call(self, inputs):
        z_mean, z_log_var = inputs
        batch = ops.shape(z_mean)[0]
        dim = ops.shape(z_mean)[1]
        epsilon = keras.random.normal(shape=(batch, dim), seed=self.seed_generator)
        return z_mean + ops.exp(0.5 * z_log_var) * epsilon


class VAE(keras.Model):
    def __init__(self, encoder, decoder, **kwargs):
        super().__init__(**kwargs)
        self.encoder = encoder
        self.decoder = decoder
        self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
        self.reconstruction_loss_tracker = keras.metrics.Mean(name="reconstruction_loss")
        self.kl_loss_tracker = keras.metrics.Mean(name="kl_loss")

    @property
    def metrics(self):
        return [self.total_loss_tracker, self.reconstruction_loss_tracker, self.kl_loss_tracker]

    def train_step(self, data):
        with tf.GradientTape() as tape:
            z_mean, z_log_var, z = self.encoder(data)
            reconstruction = self.decoder(z)
            reconstruction_loss = ops.mean(ops.sum(keras.losses.binary_crossentropy(data, reconstruction),
                                                   axis=(1, 2)))
            kl_loss = -0.5 * (1 + z_log_var - ops.square(z_mean) - ops.exp(z_log_var))
            kl_loss = ops.mean(ops.sum(kl_loss, axis=1))
            total_loss = reconstruction_loss + kl_loss
        grads = tape.gradient(total_loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        self.total_loss_tracker.update_state(total_loss)
        self.reconstruction_loss_tracker.update_state(reconstruction_loss)
        self.kl_loss_tracker.update_state(kl_loss)
        return {"loss": self.total_loss_tracker.result(),
                "reconstruction_loss": self.reconstruction_loss_tracker.result(),
                "kl_loss": self.kl_loss_tracker.result()}


def vae():
    encoder_inputs = keras.Input(shape=(16, 16, 1))
    x = layers.Conv2D(8, 3, activation="relu", strides=2, padding="same")(encoder_inputs)
    x = layers.Conv2D(16, 3, activation="relu", strides=2, padding="same")(x)
    x = layers.Flatten()(x)
    x = layers.Dense(16, activation="relu")(x)
    z_mean = layers.Dense(2, name="z_mean")(x)
    z_log_var = layers.Dense(2, name="z_log_var")(x)
    z = Sampling()([z_mean, z_log_var])
    encoder = keras.Model(encoder_inputs, [z_mean, z_log_var, z], name="encoder")
    latent_inputs = keras.Input(shape=(2,))
    x = layers.Dense(4 * 4 * 16, activation="relu")(latent_inputs)
    x = layers.Reshape((4, 4, 16))(x)
    x = layers.Conv2DTranspose(16, 3, activation="relu", strides=2, padding="same")(x)
    x = layers.Conv2DTranspose(8, 3, activation="relu", strides=2, padding="same")(x)
    decoder_outputs = layers.Conv2DTranspose(1, 3, activation="sigmoid", padding="same")(x)
    decoder = keras.Model(latent_inputs, decoder_outputs, name="decoder")
    model = VAE(encoder, decoder)
    model.compile(optimizer=keras.optimizers.Adam())
    return model


def vae_data():
    return _rng().random((SAMPLES, 16, 16, 1), dtype=np.float32)


# 8. keras.io "The Functional API": several inputs and outputs, losses and loss weights per output.
def ticket_classifier():
    title_input = keras.Input(shape=(None,), name="title")
    body_input = keras.Input(shape=(None,), name="body")
    tags_input = keras.Input(shape=(12,), name="tags")
    title_features = layers.Embedding(100, 8)(title_input)
    body_features = layers.Embedding(100, 8)(body_input)
    title_features = layers.LSTM(8)(title_features)
    body_features = layers.LSTM(4)(body_features)
    x = layers.concatenate([title_features, body_features, tags_input])
    priority_pred = layers.Dense(1, name="priority")(x)
    department_pred = layers.Dense(4, name="department")(x)
    model = keras.Model(inputs=[title_input, body_input, tags_input], outputs=[priority_pred, department_pred])
    model.compile(optimizer=keras.optimizers.RMSprop(1e-3),
                  loss={"priority": keras.losses.BinaryCrossentropy(from_logits=True),
                        "department": keras.losses.CategoricalCrossentropy(from_logits=True)},
                  loss_weights={"priority": 1.0, "department": 0.2})
    return model


def ticket_data():
    rng = _rng()
    title = rng.integers(0, 100, (SAMPLES, 10))
    body = rng.integers(0, 100, (SAMPLES, 30))
    tags = rng.integers(0, 2, (SAMPLES, 12)).astype("float32")
    priority = rng.random((SAMPLES, 1), dtype=np.float32)
    department = keras.utils.to_categorical(rng.integers(0, 4, SAMPLES), 4)
    return {"title": title, "body": body, "tags": tags}, {"priority": priority, "department": department}


# 9. keras.io "Making new layers and models via subclassing": a subclassed model with call().
class MLPBlock(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense_1 = layers.Dense(32, activation="relu")
        self.dense_2 = layers.Dense(32, activation="relu")
        self.dense_3 = layers.Dense(10)

    def call(self, inputs):
        x = self.dense_1(inputs)
        x = self.dense_2(x)
        return self.dense_3(x)


def subclassed_mlp():
    model = MLPBlock()
    model.compile(optimizer=keras.optimizers.SGD(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def flat_data():
    rng = _rng()
    return rng.random((SAMPLES, 20), dtype=np.float32), rng.integers(0, 10, SAMPLES)


# 10. keras.applications MobileNetV2 (BatchNormalization throughout), untrained, SGD.
# Its training on noise is chaotic: weights perturbed by 1e-7 (relative) change plain Keras'
# first-epoch loss by 3.5e-4 after six steps, so a plan that only rounds differently (an op
# fusion a device boundary prevents) fails a 1e-5 check of later losses. Five batches: two
# warm-up steps, one profiled, and two planned (the second's loss shows the first's update).
def mobilenet_v2():
    model = keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=10)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return model


def small_images():
    rng = _rng()
    return rng.random((80, 32, 32, 3), dtype=np.float32), rng.integers(0, 10, 80)


# 11. A GRU over padded sequences of unknown length (padded_batch), masking.
def gru_classifier():
    model = keras.Sequential([
        keras.Input(shape=(None,), dtype="int32"),
        layers.Embedding(50, 8, mask_zero=True),
        layers.GRU(8),
        layers.Dense(3),
    ])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def padded_sequences():
    rng = _rng()
    lengths = rng.integers(3, 9, SAMPLES)

    def generate():
        for i, length in enumerate(lengths):
            yield rng.integers(1, 50, length).astype("int32"), int(i % 3)

    signature = (tf.TensorSpec((None,), tf.int32), tf.TensorSpec((), tf.int64))
    data = list(generate())
    return tf.data.Dataset.from_generator(lambda: iter(data), output_signature=signature).padded_batch(16)


# 12. Conv1D text classifier with sample weights and class weights, validation data.
def conv1d_classifier():
    inputs = keras.Input(shape=(None,), dtype="int64")
    x = layers.Embedding(100, 8)(inputs)
    x = layers.Conv1D(16, 3, padding="valid", activation="relu", strides=1)(x)
    x = layers.GlobalMaxPooling1D()(x)
    x = layers.Dense(16, activation="relu")(x)
    predictions = layers.Dense(1, activation="sigmoid", name="predictions")(x)
    model = keras.Model(inputs, predictions)
    model.compile(loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"])
    return model


def weighted_text_data():
    rng = _rng()
    x = rng.integers(0, 100, (SAMPLES, 24))
    y = rng.integers(0, 2, SAMPLES).astype("float32")
    weights = rng.random(SAMPLES).astype("float32") + 0.5
    return x, y, weights


# 13. Mixed precision (mixed_float16) on a small MLP; the policy is set around build().
def mixed_precision_mlp():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        inputs = keras.Input(shape=(20,))
        x = layers.Dense(32, activation="relu")(inputs)
        x = layers.Dense(32, activation="relu")(x)
        outputs = layers.Activation("linear", dtype="float32")(layers.Dense(10)(x))
        model = keras.Model(inputs, outputs)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


# 14. ResNet-style CNN with BatchNormalization, steps_per_execution > 1.
def resnet_like():
    inputs = keras.Input(shape=(16, 16, 3))
    x = layers.Conv2D(16, 3, padding="same", use_bias=False)(inputs)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU()(x)
    for _ in range(2):
        shortcut = x
        x = layers.Conv2D(16, 3, padding="same", use_bias=False)(x)
        x = layers.BatchNormalization()(x)
        x = layers.ReLU()(x)
        x = layers.Conv2D(16, 3, padding="same", use_bias=False)(x)
        x = layers.BatchNormalization()(x)
        x = layers.ReLU()(layers.Add()([x, shortcut]))
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(5)(x)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=2)
    return model


def cifar_like():
    rng = _rng()
    return rng.random((SAMPLES, 16, 16, 3), dtype=np.float32), rng.integers(0, 5, SAMPLES)


# 15. Sequential MLP with Dropout and a validation split (keras.io getting started).
def dropout_mlp():
    model = keras.Sequential([
        keras.Input(shape=(20,)),
        layers.Dense(64, activation="relu"),
        layers.Dropout(0.5),
        layers.Dense(64, activation="relu"),
        layers.Dropout(0.5),
        layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.01, momentum=0.9),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


# 16. keras.io "Text classification with Switch Transformer", in Keras 3 ops: a router
# that reshapes the tokens with the batch size the model was built for, so fit runs at that batch
# only (and predict and evaluate too); random noise on the router's logits from Keras' global
# seed generator (the page itself draws it with tf.random.uniform: docs/what-kerasflow-plans.md); an
# auxiliary loss added by a layer.
SWITCH_BATCH, SWITCH_TOKENS, SWITCH_EXPERTS = 50, 32, 4


def load_balanced_loss(router_probs, expert_mask):
    num_experts = ops.shape(expert_mask)[-1]
    density = ops.mean(expert_mask, axis=0)
    density_proxy = ops.mean(router_probs, axis=0)
    return ops.mean(density_proxy * density) * ops.cast((num_experts**2), "float32")


class Router(layers.Layer):
    def __init__(self, num_experts, expert_capacity):
        self.num_experts = num_experts
        self.route = layers.Dense(units=num_experts)
        self.expert_capacity = expert_capacity
        super().__init__()

    def call(self, inputs, training=False):
        router_logits = self.route(inputs)
        if training:
            router_logits += keras.random.uniform(shape=router_logits.shape, minval=0.9, maxval=1.1)
        router_probs = keras.activations.softmax(router_logits, axis=-1)
        expert_gate, expert_index = ops.top_k(router_probs, k=1)
        expert_mask = ops.one_hot(expert_index, self.num_experts)
        self.add_loss(load_balanced_loss(router_probs, expert_mask))
        position_in_expert = ops.cast(ops.cumsum(expert_mask, axis=0) * expert_mask, "int32")
        expert_mask *= ops.cast(ops.less(ops.cast(position_in_expert, "int32"), self.expert_capacity), "float32")
        expert_mask_flat = ops.sum(expert_mask, axis=-1)
        expert_gate *= expert_mask_flat
        combined_tensor = ops.expand_dims(
            expert_gate * expert_mask_flat * ops.squeeze(ops.one_hot(expert_index, self.num_experts), 1), -1,
        ) * ops.squeeze(ops.one_hot(position_in_expert, self.expert_capacity), 1)
        dispatch_tensor = ops.cast(combined_tensor, "float32")
        return dispatch_tensor, combined_tensor


class Switch(layers.Layer):
    def __init__(self, num_experts, embed_dim, ff_dim, num_tokens_per_batch):
        self.num_tokens_per_batch = num_tokens_per_batch
        self.num_experts = num_experts
        self.embed_dim = embed_dim
        self.experts = [keras.Sequential([layers.Dense(ff_dim, activation="relu"), layers.Dense(embed_dim)])
                        for _ in range(num_experts)]
        self.expert_capacity = num_tokens_per_batch // self.num_experts
        self.router = Router(self.num_experts, self.expert_capacity)
        super().__init__()

    def call(self, inputs):
        batch_size = ops.shape(inputs)[0]
        num_tokens_per_example = ops.shape(inputs)[1]
        inputs = ops.reshape(inputs, [self.num_tokens_per_batch, self.embed_dim])
        dispatch_tensor, combine_tensor = self.router(inputs)
        expert_inputs = ops.einsum("ab,acd->cdb", inputs, dispatch_tensor)
        expert_inputs = ops.reshape(expert_inputs, [self.num_experts, self.expert_capacity, self.embed_dim])
        expert_outputs = ops.stack([expert(expert_input) for expert, expert_input
                                    in zip(self.experts, ops.unstack(expert_inputs, axis=0))], axis=1)
        combined = ops.einsum("abc,xba->xc", expert_outputs, combine_tensor)
        return ops.reshape(combined, [batch_size, num_tokens_per_example, self.embed_dim])


class SwitchTransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ffn, dropout_rate=0.1):
        super().__init__()
        self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = ffn
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(dropout_rate)
        self.dropout2 = layers.Dropout(dropout_rate)

    def call(self, inputs, training=False):
        attn_output = self.dropout1(self.att(inputs, inputs), training=training)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.dropout2(self.ffn(out1), training=training)
        return self.layernorm2(out1 + ffn_output)


def switch_transformer():
    embed_dim, ff_dim, num_heads = 16, 16, 2
    switch = Switch(SWITCH_EXPERTS, embed_dim, ff_dim, SWITCH_BATCH * SWITCH_TOKENS)
    inputs = layers.Input(shape=(SWITCH_TOKENS,))
    x = TokenAndPositionEmbedding(SWITCH_TOKENS, VOCAB, embed_dim)(inputs)
    x = SwitchTransformerBlock(embed_dim // num_heads, num_heads, switch)(x)
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.Dropout(0.25)(x)
    x = layers.Dense(ff_dim, activation="relu")(x)
    x = layers.Dropout(0.25)(x)
    outputs = layers.Dense(2, activation="softmax")(x)
    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def switch_data():
    rng = _rng()
    return rng.integers(0, VOCAB, (SAMPLES, SWITCH_TOKENS)), rng.integers(0, 2, SAMPLES)


def switch_validation_data():
    rng = np.random.default_rng(1)
    return rng.integers(0, VOCAB, (SWITCH_BATCH, SWITCH_TOKENS)), rng.integers(0, 2, SWITCH_BATCH)


PATTERNS = [
    Pattern("mnist_convnet", mnist_convnet, mnist_data, {"batch_size": 32},
            "Sequential, Conv2D, MaxPooling2D, Flatten, Dropout, arrays"),
    Pattern("image_classifier", image_classifier, image_dataset, {},
            "tf.data with a partial last batch, RandomFlip, Rescaling, SeparableConv2D, BatchNormalization, residuals",
            predictions_follow_rounding=True),
    Pattern("text_transformer", text_transformer, text_data, {"batch_size": 32},
            "custom layers, Embedding, MultiHeadAttention, LayerNormalization, Dropout", keras_file=False,
            callback_route=False),  # the strategy route covers it; the callback route adds 19 s
    Pattern("weather_lstm", weather_lstm, weather_dataset, {},
            "timeseries_dataset_from_array (unknown batch size), LSTM"),
    Pattern("wide_and_deep", wide_and_deep, structured_dataset, {},
            "dict inputs, string inputs, StringLookup, IntegerLookup, Normalization, Hashing, CategoryEncoding",
            h5_file=False),
    Pattern("gan", gan, gan_dataset, {},
            "subclassed model, custom train_step, two sub-models, two optimizers, Conv2DTranspose",
            keras_file=False, callable=False),
    Pattern("vae", vae, vae_data, {"batch_size": 32},
            "subclassed model without call(), custom train_step, sub-models, random sampling layer",
            keras_file=False, callable=False),
    Pattern("ticket_classifier", ticket_classifier, ticket_data, {"batch_size": 32},
            "several inputs and outputs, unknown sequence length, per-output losses, LSTM, RMSprop"),
    Pattern("subclassed_mlp", subclassed_mlp, flat_data, {"batch_size": 32, "validation_split": 0.2},
            "subclassed model with call(), validation data", keras_file=False),
    Pattern("mobilenet_v2", mobilenet_v2, small_images, {"batch_size": 16},
            "keras.applications MobileNetV2, BatchNormalization, DepthwiseConv2D",
            # Weights round trip only, and no callback route in the suite: its .keras and .h5
            # reloads and a second profile of its step would add most of a minute to it.
            keras_file=False, callback_route=False, amplifies_rounding=True),
    Pattern("gru_padded", gru_classifier, padded_sequences, {},
            "padded_batch (unknown batch and length), Embedding mask_zero, GRU"),
    Pattern("conv1d_weighted", conv1d_classifier, weighted_text_data, {"batch_size": 32},
            "Conv1D, GlobalMaxPooling1D, sample weights"),
    Pattern("mixed_precision", mixed_precision_mlp, flat_data, {"batch_size": 32},
            "mixed_float16 policy"),
    Pattern("resnet_steps_per_execution", resnet_like, cifar_like, {"batch_size": 16},
            "BatchNormalization, residual Add, steps_per_execution=2"),
    Pattern("dropout_mlp", dropout_mlp, flat_data,
            {"batch_size": 32, "validation_split": 0.2, "class_weight": {i: 1.0 + i / 10 for i in range(10)}},
            "Sequential, Dropout, SGD with momentum, validation_split, class weights"),
    Pattern("switch_transformer", switch_transformer, switch_data,
            {"batch_size": SWITCH_BATCH, "validation_data": switch_validation_data()},
            "a layer that reshapes with the batch size it was built for, unseeded keras.random noise, "
            "a layer's add_loss, MultiHeadAttention, validation_data", keras_file=False, one_batch_size=True),
]
