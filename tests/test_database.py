"""The tuning database survives what happens to files: truncated lines, hand edits, a tuner
killed with SIGKILL, and two processes writing at once."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from unit_tvm.tuner import Database, DatabaseWarning

CONFIG = {"unroll": [], "parallel": 1, "reduce_split": [], "front": -1}


def test_a_record_appended_after_a_truncated_line_is_not_lost(tmp_path):
    path = tmp_path / "db.jsonl"
    db = Database(path)
    db.append("w1", "llvm", "x86.vpdpbusd", CONFIG, 100.0)
    with open(path, "a") as f:
        f.write('{"schema": "unit-tvm/tuning/1", "workload": "w2", "tar')  # killed mid-write
    db.append("w3", "llvm", "x86.vpdpbusd", CONFIG, 300.0)
    with pytest.warns(DatabaseWarning, match="corrupt line"):
        recs = db.records()
    assert [r["workload"] for r in recs] == ["w1", "w3"]
    assert db.lookup("w3", "llvm", "x86.vpdpbusd")["gops"] == 300.0


def test_garbage_without_a_newline_does_not_swallow_the_next_record(tmp_path):
    path = tmp_path / "db.jsonl"
    path.write_bytes(b"\x00\xffgarbage")
    Database(path).append("w", "llvm", "x86.vpdpbusd", CONFIG, 1.5)
    with pytest.warns(DatabaseWarning):
        assert Database(path).lookup("w", "llvm", "x86.vpdpbusd")["gops"] == 1.5


@pytest.mark.parametrize("field,value", [("gops", "fast"), ("gops", None), ("gops", True),
                                         ("gops", float("nan")), ("config", None),
                                         ("config", [1, 2]), ("workload", 7),
                                         ("intrinsic", ["x86.vpdpbusd"])])
def test_a_record_with_a_field_of_the_wrong_type_is_skipped_with_a_warning(tmp_path, field,
                                                                           value):
    path = tmp_path / "db.jsonl"
    db = Database(path)
    db.append("w", "llvm", "x86.vpdpbusd", CONFIG, 10.0)
    bad = {"schema": "unit-tvm/tuning/1", "workload": "w", "target": "llvm",
           "intrinsic": "x86.vpdpbusd", "config": CONFIG, "gops": 99.0}
    bad[field] = value
    with open(path, "a") as f:
        f.write(json.dumps(bad) + "\n")
    with pytest.warns(DatabaseWarning, match=f"{field} is"):
        best = db.lookup("w", "llvm", "x86.vpdpbusd")
    assert best["gops"] == 10.0


def test_appending_a_record_of_the_wrong_type_is_refused(tmp_path):
    with pytest.raises(TypeError, match="gops"):
        Database(tmp_path / "db.jsonl").append("w", "llvm", "x", CONFIG, "fast")
    with pytest.raises(TypeError, match="file path"):
        Database(42)


_WRITER = textwrap.dedent("""
    import sys
    from unit_tvm.tuner import Database
    db = Database(sys.argv[1])
    for i in range(int(sys.argv[3])):
        db.append(f"{sys.argv[2]}-{i}", "llvm", "x86.vpdpbusd",
                  {"unroll": [[0, i % 8 + 1]] * 40, "parallel": 1}, float(i))
""")


def test_two_processes_appending_at_once_lose_and_interleave_nothing(tmp_path):
    path = tmp_path / "db.jsonl"
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    procs = [subprocess.Popen([sys.executable, str(script), str(path), name, "300"])
             for name in ("a", "b")]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    lines = path.read_text().splitlines()
    assert len(lines) == 600
    recs = Database(path).records()  # a corrupt line would warn and be missing
    assert sorted(r["workload"] for r in recs) == sorted(
        f"{n}-{i}" for n in "ab" for i in range(300))


_TUNER = textwrap.dedent("""
    import sys
    from tvm import te
    import unit_tvm
    a = te.placeholder((64, 256), "uint8", name="A")
    b = te.placeholder((int(sys.argv[2]), 256), "int8", name="B")
    k = te.reduce_axis((0, 256), name="k")
    c = te.compute((64, int(sys.argv[2])), lambda i, j: te.sum(
        a[i, k].astype("int32") * b[j, k].astype("int32"), axis=k), name="C")
    unit_tvm.build([a, b, c], tune=True, trials=int(sys.argv[3]), database=sys.argv[1])
    print("done", flush=True)
""")


def _tuner(tmp_path, path, n, trials):
    script = tmp_path / "tuner.py"
    script.write_text(_TUNER)
    env = dict(os.environ, UNIT_TVM_QUIET="1", TVM_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, str(script), str(path), str(n), str(trials)],
                            env=env, stdout=subprocess.PIPE, text=True)


def test_a_tuner_killed_mid_run_leaves_a_database_the_next_run_uses(tmp_path):
    path = tmp_path / "db.jsonl"
    Database(path).append("earlier", "llvm", "x86.vpdpbusd", CONFIG, 1.0)
    proc = _tuner(tmp_path, path, 64, 64)
    time.sleep(6)  # importing TVM and starting to tune
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert Database(path).lookup("earlier", "llvm", "x86.vpdpbusd") is not None
    again = _tuner(tmp_path, path, 64, 4)
    assert again.communicate(timeout=600)[0].strip() == "done" and again.returncode == 0
    recs = Database(path).records()
    assert recs[0]["workload"] == "earlier" and len(recs) >= 2


def test_two_processes_tuning_one_database_both_keep_their_records(tmp_path):
    path = tmp_path / "db.jsonl"
    procs = [_tuner(tmp_path, path, n, 3) for n in (48, 80)]
    assert all(p.communicate(timeout=600)[0].strip() == "done" for p in procs)
    recs = Database(path).records()
    assert len(recs) >= 2 and all(isinstance(r["gops"], float) for r in recs)
