"""Fixtures shared by the engine tests, found by name (no test module imports them)."""
from tests.engine.fault_harness import make  # noqa: F401  (the fault tests: engine or loop)
from tests.engine.fuzz_values import print_counts  # noqa: F401  (the fuzz tests' report)
