"""A fleet on this machine: a TVM RPC tracker and unit-tvm servers as child processes on
loopback. The tests use it, and so does `unit-tvm reproduce --local-fleet`; on real machines
the same two commands run on each host (scripts/fleet/README.md)."""

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from tvm import rpc

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def _start(args, log):
    # a process group of its own: TVM's server forks a worker per session, and stop() must
    # end them all
    return subprocess.Popen([sys.executable, "-m", *args], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


@dataclass
class LocalFleet:
    """Tracker + servers on loopback. Use as a context manager; `servers` is a list of
    (key, isa or None) per server."""

    servers: list = field(default_factory=lambda: [("local", None)])
    threads: int = 1  # TVM threads per server (they share this machine's cores)
    log_path: str = os.devnull
    timeout: float = 120.0  # seconds to wait for the tracker and every server
    port: int = 0
    _procs: dict = field(default_factory=dict, repr=False)

    @property
    def tracker(self) -> str:
        """HOST:PORT of the tracker."""
        return f"{LOOPBACK}:{self.port}"

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self):
        """Start the tracker, then each server, and wait until the tracker lists them all."""
        self.port = self.port or free_port()
        self._log = open(self.log_path, "a")
        self._procs["tracker"] = _start(["tvm.exec.rpc_tracker", "--host", LOOPBACK, "--port",
                                         str(self.port), "--port-end", str(self.port + 1),
                                         ], self._log)
        self._wait(lambda s: True, "the tracker")
        for key, isa in self.servers:  # started together: each spends seconds importing TVM
            self._start_server(key, isa)
        self._wait_servers()
        return self

    def add_server(self, key, isa=None) -> str:
        """Start one more server under `key` (restricted to `isa`), wait for it; its name."""
        name = self._start_server(key, isa)
        self._wait_servers()
        return name

    def _start_server(self, key, isa):
        name = f"server{sum(1 for p in self._procs if p != 'tracker')}"
        args = ["unit_tvm.fleet.server", "--tracker", self.tracker, "--key", key,
                "--host", LOOPBACK, "--port", str(port := free_port()), "--port-end",
                str(port + 100), "--threads", str(self.threads)]
        self._procs[name] = _start(args + (["--isa", isa] if isa else []), self._log)
        return name

    def _wait_servers(self):
        want = sum(1 for p in self._procs if p != "tracker")
        self._wait(lambda s: _registered(s) >= want, f"{want} servers")

    def kill(self, name):
        """Kill a server and every process it forked (a machine lost mid-run)."""
        proc = self._procs.pop(name)
        _kill_group(proc)

    def stop(self):
        """Stop every server, then the tracker."""
        for name in [p for p in self._procs if p != "tracker"] + ["tracker"]:
            if name in self._procs:
                _kill_group(self._procs.pop(name))
        if getattr(self, "_log", None):
            self._log.close()

    def _wait(self, ready, what):
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            dead = [n for n, p in self._procs.items() if p.poll() is not None]
            if dead:
                self.stop()
                raise RuntimeError(f"{', '.join(dead)} exited while starting the local fleet "
                                   f"(log: {self.log_path})")
            try:
                # a plain socket first: TVM's client retries a closed port for a minute
                socket.create_connection((LOOPBACK, self.port), timeout=1).close()
                if ready(rpc.connect_tracker(LOOPBACK, self.port).summary()):
                    return
            except (OSError, RuntimeError):
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"{what} did not come up within {self.timeout:.0f} s")


def _registered(summary) -> int:
    return sum(int(v.get("free", 0)) for v in summary.get("queue_info", {}).values())


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)
