"""Tuner: search over a strategy's knobs with a cost model and a tuning database."""
