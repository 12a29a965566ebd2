"""The planner's second floor: what a plan costs (task graphs, the event-driven simulator, predictions).

The names users need are exported by ``kerasflow.planner``; see its docstring for the floors.
"""
