"""An RPC server for a fleet machine: TVM's own server (`tvm.rpc.Server`) registered with a
tracker under a key, plus the functions a client calls on it: `unit_tvm.fleet.describe` (this
machine's CPU as a target, so kernels are built for it and only sent where they run),
`unit_tvm.fleet.torch_int8_seconds` (PyTorch's int8 op timed there, the bench-op baseline) and
`unit_tvm.fleet.bench_model` (bench-model run there: every engine in one process, one protocol).

    python -m unit_tvm.fleet.server --tracker HOST:PORT --key KEY [--isa LEVEL] [--threads N]
"""

import argparse
import functools
import json
import os
import socket

import tvm_ffi
from tvm import rpc
from tvm.rpc.server import PopenRPCServerState

from ..bench.op_level import time_torch
from ..runner import prepare_host
from ..target import ISA_LEVELS, host, isa_level

DESCRIBE = "unit_tvm.fleet.describe"
TORCH_SECONDS = "unit_tvm.fleet.torch_int8_seconds"
BENCH_MODEL = "unit_tvm.fleet.bench_model"


def target_spec(target) -> dict:
    """The parts of a CPU target that decide what runs where (kind, triple, CPU, features,
    cores), as a dict tvm.target.Target accepts."""
    spec = {k: v for k, v in dict(target.export()).items()
            if k in ("kind", "mcpu", "mattr", "num-cores", "mtriple")}
    if "mattr" in spec:
        spec["mattr"] = [str(f) for f in spec["mattr"]]  # a TVM Array is not JSON
    return spec


def describe() -> str:
    """JSON: this server's address, CPU model and target (the ISA level it was started with)."""
    state = PopenRPCServerState.current
    port = state.port if state is not None else 0
    threads = os.environ.get("TVM_NUM_THREADS")
    target = host(int(threads)) if threads else host()
    return json.dumps({"address": f"{socket.gethostname()}:{port}", "cpu": _cpu_model(),
                       "isa": isa_level(), "target": target_spec(target)})


def torch_int8_seconds(request: str) -> float:
    """PyTorch's int8 op (bench-op's baseline) timed on this server: request is JSON
    {"kind", "shape", "threads", "repeat"}; -1 when PyTorch is not installed here."""
    try:
        import torch  # noqa: F401 - only to know whether the baseline can run here
    except ImportError:
        return -1.0
    r = json.loads(request)
    return time_torch(r["kind"], tuple(r["shape"]), int(r["threads"]), int(r["repeat"]))


def bench_model(request: str) -> str:
    """bench-model of one zoo model run on this server (request: JSON of
    unit_tvm.bench.model.run_model's arguments); the result as JSON. unit-tvm's configs come
    from this server's database (tuned here when the request says tune)."""
    from ..bench.model import run_model  # the engines' packages load only when asked

    r = json.loads(request)
    result = run_model(r.pop("name"), engines=tuple(r.pop("engines")), log=lambda *a: None, **r)
    return json.dumps(result, default=str)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def register(isa=None, threads=None):
    """Runs in the server's worker process before it serves (TVM's server_init_callback):
    restricts the ISA level and thread count, then registers the functions clients call.
    Sessions are forked from that process, so they inherit all three."""
    if isa:
        os.environ["UNIT_TVM_ISA"] = isa
    if threads:
        os.environ["TVM_NUM_THREADS"] = str(threads)
    prepare_host()
    tvm_ffi.register_global_func(DESCRIBE, describe, override=True)
    tvm_ffi.register_global_func(TORCH_SECONDS, torch_int8_seconds, override=True)
    tvm_ffi.register_global_func(BENCH_MODEL, bench_model, override=True)


def serve(tracker: str, key: str, *, host="0.0.0.0", port=9190, port_end=9290, isa=None,
          threads=None, custom_addr=None, silent=False):
    """Start a server registered with `tracker` (HOST:PORT) under `key`; returns the
    tvm.rpc.Server (its process serves until it is killed)."""
    if isa and isa not in ISA_LEVELS:
        raise ValueError(f"--isa {isa!r} is not one of {', '.join(ISA_LEVELS)}")
    t_host, t_port = tracker.rsplit(":", 1)
    return rpc.Server(host, port, port_end, key=key, tracker_addr=(t_host, int(t_port)),
                      custom_addr=custom_addr, silent=silent,
                      server_init_callback=functools.partial(register, isa, threads))


def main(argv=None):
    """Command line: start one server and serve until killed."""
    p = argparse.ArgumentParser(prog="python -m unit_tvm.fleet.server", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tracker", required=True, help="the tracker, HOST:PORT")
    p.add_argument("--key", required=True, help="the device kind clients ask the tracker for")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on")
    p.add_argument("--port", type=int, default=9190, help="first port to try")
    p.add_argument("--port-end", type=int, default=9290, help="last port to try")
    p.add_argument("--custom-addr", help="address reported to the tracker (behind NAT)")
    p.add_argument("--isa", help="restrict this CPU to an ISA level, e.g. avx512_core_vnni")
    p.add_argument("--threads", type=int, help="TVM worker threads (default: every CPU)")
    p.add_argument("--silent", action="store_true")
    a = p.parse_args(argv)
    server = serve(a.tracker, a.key, host=a.host, port=a.port, port_end=a.port_end, isa=a.isa,
                   threads=a.threads, custom_addr=a.custom_addr, silent=a.silent)
    print(f"unit-tvm RPC server on port {server.port}, key {a.key!r}, tracker {a.tracker}",
          flush=True)
    server.proc.join()


if __name__ == "__main__":
    main()
