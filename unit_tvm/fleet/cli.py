"""The command-line options every measuring command shares for a fleet: --rpc-tracker HOST:PORT,
--rpc-key KEY and, for plain TVM servers, --rpc-target."""

import argparse
import json

from .rpc import RpcRunner


def add_rpc_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the fleet options to a command's parser."""
    g = parser.add_argument_group("measuring on other machines (TVM RPC tracker)")
    g.add_argument("--rpc-tracker", metavar="HOST:PORT",
                   help="time kernels on the servers registered with this tracker")
    g.add_argument("--rpc-key", metavar="KEY", help="the servers' key (their device kind)")
    g.add_argument("--rpc-target", metavar="JSON",
                   help="their target, e.g. '{\"kind\": \"llvm\", \"mcpu\": \"znver4\"}' "
                        "(default: what unit-tvm's servers report)")


def runner_from_args(args) -> RpcRunner | None:
    """An RpcRunner for the parsed options, None when no tracker was given."""
    tracker, key = getattr(args, "rpc_tracker", None), getattr(args, "rpc_key", None)
    if tracker is None and key is None:
        return None
    if not tracker or not key:
        raise ValueError("--rpc-tracker and --rpc-key go together")
    target = json.loads(args.rpc_target) if getattr(args, "rpc_target", None) else None
    return RpcRunner(tracker, key, target=target)
