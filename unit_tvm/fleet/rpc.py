"""RpcRunner: kernels built here, run and timed on the servers a TVM RPC tracker holds under one
key, in parallel, each output checked against a result computed here for the same inputs.

A server that stops answering costs the kernel it was running, not the run: the kernel is run
again on another server and the loss is reported (`events`). A server whose CPU lacks a feature
the kernels are built for never receives one.
"""

import collections
import contextlib
import gc
import json
import math
import os
import queue
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass

import tvm
from tvm import rpc

from ..runner import NUMBER, REPEAT, Measurement, failure, run_checked
from ..target import arch, as_target, features, is_gpu
from .server import BENCH_MODEL, DESCRIBE, TORCH_SECONDS


@dataclass
class Server:
    """One session the runner holds on a fleet server."""

    session: object  # tvm.rpc.RPCSession
    address: str  # host:port as the server reports it
    target: object = None  # tvm.target.Target it describes (None: a plain TVM server)
    cpu: str = ""
    alive: bool = True
    kernels: int = 0  # kernels it ran


def parse_tracker(text: str) -> tuple:
    """'HOST:PORT' -> (host, port), ValueError saying what is expected otherwise."""
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"an RPC tracker is HOST:PORT (e.g. 127.0.0.1:9190), got {text!r}")
    return host, int(port)


class RpcRunner:
    """Run kernels on every free server registered under `key` at `tracker` (HOST:PORT).

    target: the target kernels are built for; default: the one most servers describe (started
    with `python -m unit_tvm.fleet.server`); required for plain `tvm.exec.rpc_server` servers,
    which cannot describe their CPU. servers: how many sessions to hold (default: every free
    one, at least one); the runner waits up to `wait` seconds for them (a server a finished
    session released re-registers with the tracker a moment later). `events` lists what
    happened to servers (one lost mid-run, ...).
    """

    def __init__(self, tracker: str, key: str, *, target=None, servers: int = 0,
                 session_timeout: int = 3600, wait: float = 60.0):
        self.tracker, self._addr = tracker, parse_tracker(tracker)
        if not key or not isinstance(key, str):
            raise ValueError(f"an RPC key names the device kind, got {key!r}")
        self.key, self.name = key, f"rpc:{key}"
        self._given = as_target(target) if target is not None else None
        self._want, self._timeout, self._wait = servers, session_timeout, wait
        self._held: list = []
        self._lock = threading.Lock()
        self.events: list = []

    def __repr__(self):
        return f"RpcRunner({self.tracker!r}, {self.key!r})"

    # -- sessions -------------------------------------------------------------------------------
    def open(self) -> list:
        """The sessions held (opened on first use): one per free server under the key."""
        if self._held:
            return self._held
        try:
            client = rpc.connect_tracker(*self._addr)
        except (OSError, RuntimeError) as e:
            raise RuntimeError(f"no RPC tracker answers at {self.tracker}: {failure(e)}") from e
        deadline = time.monotonic() + self._wait
        while True:
            queues = client.summary()["queue_info"]
            free = int(queues.get(self.key, {}).get("free", 0))
            if free >= max(self._want, 1) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if free < max(self._want, 1):
            known = ", ".join(f"{k} ({v.get('free', 0)} free)" for k, v in queues.items())
            raise RuntimeError(f"the tracker at {self.tracker} has {free} free servers under key "
                               f"{self.key!r} after {self._wait:.0f} s, {max(self._want, 1)} "
                               f"wanted; it has: {known or 'none'}")
        for _ in range(self._want or free):
            session = client.request(self.key, session_timeout=self._timeout)
            self._held.append(_describe(session))
        return self._held

    def close(self):
        """Give the sessions back to the tracker: a session ends when the last handle on it
        (its modules, tensors, functions) is freed, so the handles are dropped here and any
        cycle still holding one is collected, not left for a later collection."""
        for server in self._held:
            server.session = None
        self._held.clear()
        gc.collect()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def target(self) -> tvm.target.Target:
        """The target kernels are built for (see the class docstring)."""
        if self._given is not None:
            return self._given
        described = [s.target for s in self.open() if s.target is not None]
        if not described:
            raise RuntimeError(f"the servers under key {self.key!r} do not describe their CPU "
                               "(plain TVM servers): start them with `python -m "
                               "unit_tvm.fleet.server`, or give the target (--rpc-target)")
        counts = collections.Counter(str(t) for t in described)
        by_name = {str(t): t for t in described}
        # the most servers, then the most features: a restricted server is the exception
        best = max(counts, key=lambda s: (counts[s], len(features(by_name[s]))))
        return by_name[best]

    def usable(self, target=None) -> list:
        """The live servers whose CPU runs kernels built for `target` (default: self.target())."""
        target = as_target(target) if target is not None else self.target()
        return [s for s in self.open() if s.alive and _runs(s, target)]

    # -- measuring ------------------------------------------------------------------------------
    def measure(self, libs, arrays, expected=None, *, number=NUMBER, repeat=REPEAT):
        """Every lib run, checked and timed on one of the usable servers, in parallel (see
        Runner.measure); a lib whose server is lost is run again on another. A lib listed more
        than once (the tuner's final round times its best configs in turn, twice) is exported
        once."""
        target = self.target()
        if not self.usable(target):
            raise RuntimeError(f"no live server under key {self.key!r} runs kernels built for "
                               f"{target}")
        with tempfile.TemporaryDirectory() as tmp:
            exported = {}
            for lib in libs:
                if id(lib) not in exported:
                    exported[id(lib)] = os.path.join(tmp, f"unit_tvm_{uuid.uuid4().hex[:12]}.so")
                    lib.export_library(exported[id(lib)])
            paths = [exported[id(lib)] for lib in libs]
            results = [None] * len(libs)
            pending = list(range(len(libs)))
            while pending:
                servers = self.usable(target)
                if not servers:
                    raise RuntimeError(f"every server under key {self.key!r} stopped answering")
                self._round(servers, pending, paths, arrays, expected, number, repeat, results,
                            is_gpu(target))
                pending = [i for i, r in enumerate(results) if r is None]
        return results

    def _round(self, servers, pending, paths, arrays, expected, number, repeat, results, gpu):
        jobs = queue.SimpleQueue()
        for i in pending:
            jobs.put(i)

        def work(server):
            while True:
                try:
                    i = jobs.get_nowait()
                except queue.Empty:
                    return
                try:
                    secs = _run(server, paths[i], arrays, expected, number, repeat, gpu)
                    results[i] = Measurement(secs, "", server.address)
                    server.kernels += 1
                except Exception as e:  # noqa: BLE001 - a kernel's failure is its result
                    if _answers(server):
                        results[i] = Measurement(math.inf, failure(e), server.address)
                        continue
                    server.alive = False
                    with self._lock:
                        self.events.append(f"server {server.address} stopped answering "
                                           f"({failure(e)}); its kernel runs again elsewhere")
                    return  # the kernel stays pending for the next round

        threads = [threading.Thread(target=work, args=(s,), daemon=True) for s in servers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def torch_int8_seconds(self, kind, shape, threads, repeat) -> float:
        """PyTorch's int8 op timed on the first usable server (None when it has no PyTorch or
        is a plain TVM server)."""
        server, remote = self._remote_function(TORCH_SECONDS)
        if remote is None:
            return None
        secs = float(remote(json.dumps({"kind": kind, "shape": list(shape), "threads": threads,
                                        "repeat": repeat})))
        return secs if secs > 0 else None

    def bench_model(self, name, *, engines, **options) -> dict:
        """unit-tvm bench-model of zoo model `name` run on the first usable server (every
        engine there, in one process, by one timing protocol); its plain-data result."""
        server, remote = self._remote_function(BENCH_MODEL)
        if remote is None:
            raise RuntimeError(f"server {server.address} cannot run bench-model (a plain TVM "
                               "server, or an older unit-tvm)")
        result = json.loads(remote(json.dumps({"name": name, "engines": list(engines),
                                               **options})))
        result["device"] = f"{self.name} {server.address}"
        return result

    def _remote_function(self, name):
        """(first usable server, its function `name` or None when it does not register it)."""
        server = self.usable()[0]
        try:
            return server, server.session.get_function(name)
        except (AttributeError, RuntimeError):
            return server, None


def _describe(session) -> Server:
    """A Server for a fresh session, with its CPU when it runs unit-tvm's server."""
    try:
        info = json.loads(session.get_function(DESCRIBE)())
    except (AttributeError, RuntimeError, ValueError, KeyError):
        return Server(session, "(plain TVM server)")
    return Server(session, info["address"], tvm.target.Target(info["target"]), info.get("cpu", ""))


def _runs(server, target) -> bool:
    """Whether kernels built for `target` run on `server`'s CPU (a plain server: trusted)."""
    if server.target is None or is_gpu(target):
        return True
    if arch(server.target) != arch(target):
        return False
    return features(target) <= features(server.target) | {"64bit"}


def _run(server, path, arrays, expected, number, repeat, gpu) -> float:
    session, name = server.session, os.path.basename(path)
    session.upload(path)
    try:
        lib = session.load_module(name)
        dev = session.cuda() if gpu else session.cpu()
        return run_checked(lib, dev, arrays, expected, number, repeat)
    finally:
        with contextlib.suppress(Exception):  # a lost server cannot remove files either
            session.remove(name)


def _answers(server) -> bool:
    """Whether the server's session still answers a call."""
    try:
        # a function every TVM server registers: a real round trip (a device handle is not)
        server.session.get_function("tvm.rpc.server.workpath")("")
        return True
    except Exception:  # noqa: BLE001 - any failure here means the session is gone
        return False
