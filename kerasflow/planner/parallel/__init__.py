"""The planner's fourth floor: the parallel forms (baselines, Tick-Tock, one-copy data parallelism, splits).

The names users need are exported by ``kerasflow.planner``; see its docstring for the floors.
"""
