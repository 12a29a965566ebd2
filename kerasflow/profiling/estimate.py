"""Static cost estimates for hardware you do not have, from each op's FLOPs and bytes.

The profiler records every op's FLOPs and bytes moved (from static shapes, affine in the
batch); ``estimate_costs`` turns them into seconds on a device kind with a roofline and a
per-kernel launch overhead (``kerasflow.planner.ir.costmodel``), using the datasheet figures
in ``kerasflow.planner.ir.hardware`` (K80, V100, A100, H100, H200, CPU).
"""

from kerasflow.planner.ir.costmodel import estimate_costs

__all__ = ["estimate_costs"]
