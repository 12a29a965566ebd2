"""kerasflow.strategies: the TensorFlow-facing layer (see ../shared/DESIGN.md); filled in by later issues."""

__all__: list[str] = []
