"""Tuning database: JSON lines keyed by workload + target + instruction.

Each line is one finished tuning result. A line is appended in a single write on a file opened
with O_APPEND under an exclusive lock, so concurrent tuners never interleave lines; a line left
without its newline (a process killed mid-write, a file edited by hand) is closed before the next
record, so that record is not glued onto it. A corrupt line, one not written by unit-tvm (wrong
schema) or one whose fields have the wrong types is skipped with a warning, never fatal.
"""

import fcntl
import hashlib
import json
import math
import os
import warnings

SCHEMA = "unit-tvm/tuning/1"


class DatabaseWarning(UserWarning):
    """A database line was skipped."""


def workload_key(func):
    """Stable key of a workload: sha1 of its TVMScript (shapes, dtypes, index expressions)."""
    return hashlib.sha1(func.script().encode()).hexdigest()


class Database:
    """A JSON-lines tuning database at `path` (created on first write)."""

    def __init__(self, path):
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"a tuning database is a file path (str or os.PathLike), got "
                            f"{type(path).__name__} ({path!r})")
        self.path = os.fspath(path)

    def _lines(self):
        if not os.path.exists(self.path):
            return
        with open(self.path, encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    warnings.warn(f"{self.path}:{n}: corrupt line skipped", DatabaseWarning,
                                  stacklevel=3)
                    continue
                if not isinstance(rec, dict) or rec.get("schema") != SCHEMA or not all(
                        k in rec for k in ("workload", "target", "intrinsic", "config", "gops")):
                    warnings.warn(f"{self.path}:{n}: line not written by unit-tvm skipped",
                                  DatabaseWarning, stacklevel=3)
                    continue
                wrong = _wrong_field(rec)
                if wrong:
                    warnings.warn(f"{self.path}:{n}: record skipped: {wrong}", DatabaseWarning,
                                  stacklevel=3)
                    continue
                yield rec

    def lookup(self, workload, target, intrinsic, accept=None):
        """The best record for (workload, target, intrinsic), or None. accept(record) -> bool:
        records it refuses (a config the op's current loop nest cannot take, e.g. written
        before its layout changed) are skipped with a warning."""
        best = None
        for rec in self._lines():
            if (rec["workload"], rec["target"], rec["intrinsic"]) != (workload, str(target),
                                                                       intrinsic):
                continue
            if accept is not None and not accept(rec):
                warnings.warn(f"{self.path}: {intrinsic} record with config {rec['config']} does "
                              "not fit this op's loop nest (written for another layout): skipped",
                              DatabaseWarning, stacklevel=2)
                continue
            if best is None or rec["gops"] > best["gops"]:
                best = rec
        return best

    def latest(self, workload, target):
        """The last record appended for (workload, target), whatever its instruction, or None."""
        last = None
        for rec in self._lines():
            if (rec["workload"], rec["target"]) == (workload, str(target)):
                last = rec
        return last

    def records(self):
        """Every valid record."""
        return list(self._lines())

    def append(self, workload, target, intrinsic, config, gops, **extra):
        """Append one record atomically (one write to an O_APPEND file)."""
        rec = {"schema": SCHEMA, "workload": workload, "target": str(target),
               "intrinsic": intrinsic, "config": config, "gops": gops, **extra}
        wrong = _wrong_field(rec)
        if wrong:
            raise TypeError(f"tuning record not written: {wrong}")
        data = (json.dumps(rec, sort_keys=True) + "\n").encode()
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released by close
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data  # close a line left unfinished
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(f"{self.path}: wrote {written} of {len(data)} bytes")
        finally:
            os.close(fd)
        return rec


_FIELD_TYPES = {"workload": str, "target": str, "intrinsic": str, "config": dict}


def _wrong_field(rec):
    """What is wrong with a record's field types ('' when nothing)."""
    for name, kind in _FIELD_TYPES.items():
        if not isinstance(rec[name], kind):
            return f"{name} is {type(rec[name]).__name__}, not {kind.__name__}"
    gops = rec["gops"]
    if isinstance(gops, bool) or not isinstance(gops, (int, float)) or not math.isfinite(gops) \
            or gops < 0:
        return f"gops is {gops!r}, not a finite number >= 0"
    return ""


def default_path():
    """$UNIT_TVM_DATABASE, else ~/.cache/unit-tvm/tuning.jsonl."""
    return os.environ.get("UNIT_TVM_DATABASE") or os.path.join(
        os.path.expanduser("~"), ".cache", "unit-tvm", "tuning.jsonl")
