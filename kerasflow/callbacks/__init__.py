"""kerasflow.callbacks: Keras callbacks that plan and apply FastT inside ``fit``."""

from kerasflow.callbacks.fastt import FastT

__all__ = ["FastT"]
