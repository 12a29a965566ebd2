"""Shared bits of the benchmark scripts: import path, table printing, machine line."""

from __future__ import annotations

import os
import platform
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from kerasflow.planner.report import format_table  # noqa: E402,F401


def machine() -> str:
    """One line naming the machine and Python, printed above every table."""
    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
