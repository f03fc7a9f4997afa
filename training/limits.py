"""The largest counts a run takes, from the command line or a suite file alike."""

MAX_REQUESTS = 10_000_000
"""Requests in a run (a run's memory is bounded, its workload is not)."""
MAX_SEEDS = 1000
"""Evaluation seeds (all below 1000, where the tuning seeds start)."""
MAX_TUNING_SEEDS = 100
"""best-static's tuning seeds (each one runs the whole candidate grid)."""
