"""Tuner: search over a strategy's knobs with an XGBoost cost model and a tuning database."""

from .cost_model import CostModel
from .database import Database, DatabaseWarning, default_path, workload_key
from .search import TuneResult, tune, tune_instruction

__all__ = ["tune", "tune_instruction", "TuneResult", "Database", "DatabaseWarning", "default_path",
           "workload_key", "CostModel"]
