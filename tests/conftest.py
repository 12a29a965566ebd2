"""Shared pytest configuration. The planner tests need no TensorFlow; TF tests configure
logical devices once per process in their own conftest."""
