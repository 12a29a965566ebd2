"""The planner's third floor: list scheduling (ranks, HEFT, CPOP).

The names users need are exported by ``kerasflow.planner``; see its docstring for the floors.
"""
