"""The planner's first floor: what is planned and what a plan says (graphs, clusters, plans).

The names users need are exported by ``kerasflow.planner``; see its docstring for the floors.
"""
