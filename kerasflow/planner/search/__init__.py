"""The planner's fifth floor: choosing a plan (candidates, the largest batch, bounds, re-ranking).

The names users need are exported by ``kerasflow.planner``; see its docstring for the floors.
"""
