"""The largest counts a run takes, from the command line or a suite file alike."""

from batchpilot.envs.workloads import MAX_REQUESTS

__all__ = ["MAX_REQUESTS", "MAX_SEEDS", "MAX_TUNING_SEEDS"]

MAX_SEEDS = 1000
"""Evaluation seeds (all below 1000, where the tuning seeds start)."""
MAX_TUNING_SEEDS = 100
"""best-static's tuning seeds (each one runs the whole candidate grid)."""
