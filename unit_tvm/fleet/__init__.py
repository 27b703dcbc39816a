"""Measuring on other machines through TVM's RPC tracker: `RpcRunner` (tuning, peaks and
benchmarks timed on a tracker's servers), the server entry point (`python -m
unit_tvm.fleet.server`) and `LocalFleet` (a tracker and servers on this machine)."""

from .local import LocalFleet
from .rpc import RpcRunner, parse_tracker

__all__ = ["LocalFleet", "RpcRunner", "parse_tracker"]
