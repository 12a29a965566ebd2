"""kerasflow.testing: test doubles and models for testing code that uses kerasflow.

- ``ScriptedStopwatch``: a stopwatch for ``kerasflow.strategies.Collaborators`` that runs every
  step but reports the seconds a test chose, so a plan is kept, replaced or dropped on purpose.
- ``PlansThatRan``: kerasflow's own stopwatch, noting every plan a step ran on, so that a test
  in the default configuration knows whether its outputs must equal plain Keras' bit for bit.
- ``tutorial_models``: Keras models written the way the keras.io tutorials write them, on
  synthetic data (nothing is downloaded).
- ``tutorial_runs``: one of them trained from one seed by plain Keras or through a kerasflow
  door, and what users read after ``fit`` compared with plain Keras'.
- ``rounding``: how far an output may be from plain Keras': bounds measured in the same run.
- ``testbed_models``: the benchmarks' small testbed models (MLP, CNNs, LSTM, Transformer).
- ``first_step``: the partition graphs of ``fit``'s first step, to count plain Keras' fused
  kernels beside a planned step's.
- ``soak``: many fits through both doors in one process, and what they leave behind.

The compatibility suite (``tests/compat``) and the benchmarks (``benchmarks/``) both use them.
Importing ``kerasflow.testing`` imports neither TensorFlow nor Keras; its modules are imported
by name (``from kerasflow.testing import tutorial_models``).

Example:
    >>> from kerasflow.testing import ScriptedStopwatch
    >>> ScriptedStopwatch({None: 1.0, "heft": 0.5})(lambda: "outputs", None)
    ('outputs', 1.0)
"""

from kerasflow.testing.plans_that_ran import PlansThatRan
from kerasflow.testing.scripted_stopwatch import ScriptedStopwatch

__all__ = ["PlansThatRan", "ScriptedStopwatch"]
