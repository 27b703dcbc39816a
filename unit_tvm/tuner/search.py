"""The tuner: search a strategy's knobs (CPU breakpoints, GPU window/split-K/fusion), every
candidate checked before it is timed."""

import collections
import logging
import os
import random
import time
from dataclasses import dataclass, field

import numpy as np
import tqdm
import tvm
from tvm import te

from .. import checks, lowering, selection
# the timing helpers by name: tune()'s `measure` flag would shadow the module
from ..measure import numpy_dtype, random_array, to_device
from .. import schedules
from ..prepare import Prepared
from ..rewriter import schedule
from ..runner import LocalRunner, failure, target_for
from ..target import as_target, host, is_gpu
from .cost_model import CostModel
from .database import Database, workload_key

log = logging.getLogger("unit_tvm.tuner")


@dataclass
class TuneResult:
    """Outcome of tuning one workload."""

    config: object  # the strategy's config (schedules.cpu.CpuConfig or schedules.gpu.GpuConfig)
    gops: float
    from_database: bool
    measured: int = 0
    rejected: list = field(default_factory=list)  # (config, reason) of wrong/failed candidates
    seconds: float = 0.0
    history: list = field(default_factory=list)  # (config key, gops) in measuring order
    servers: dict = field(default_factory=dict)  # where candidates ran -> how many
    events: list = field(default_factory=list)  # what the runner reported (a server lost, ...)


def _ops(prepared):
    """Multiply-adds x 2 of the core (padded work counts: it is what the instruction executes)."""
    core = prepared.core.op
    n = 1
    for ax in list(core.axis) + list(core.body[0].axis):
        n *= int(ax.dom.extent)
    return 2 * n


def _inputs(prepared, intrin, rng):
    lo_hi = intrin.operand_ranges.get("a")
    arrays = []
    for t in prepared.params:
        limits = lo_hi if (lo_hi and str(t.dtype) == "uint8") else None
        arrays.append(random_array(t.shape, t.dtype, rng, value_range=limits))
    return arrays


def reference_output(prepared, arrays, target):
    """The op computed by TVM's default schedule on this host's CPU (no unit-tvm code involved)."""
    target = as_target(target)
    func = te.create_prim_func(list(prepared.params) + [prepared.reference])
    lib = tvm.tirx.build(func, target=host() if is_gpu(target) else target)
    out = np.zeros([int(s) for s in prepared.output.shape],
                   numpy_dtype(prepared.output.dtype))
    args = to_device(arrays + [out], tvm.cpu())
    lib(*args)
    return args[-1].numpy()


def candidate_module(prepared, intrin, config, target):
    """Build one candidate (the tuner calls this; tests may replace it)."""
    return lowering.build(schedule(prepared, intrin, config, target).mod, target)


def device_for(target):
    """The device candidates run on: this CPU, or the first CUDA GPU (an error naming the
    alternatives when there is none)."""
    if not is_gpu(target):
        return tvm.cpu()
    try:
        dev = tvm.cuda(0)
        present = dev.exist
    except Exception:  # noqa: BLE001 - a runtime without CUDA has no cuda device at all
        present = False
    if not present:
        raise RuntimeError("tuning a CUDA kernel measures it on a GPU and this machine has none; "
                           "build with tune=False (the default config) or with a database "
                           "tuned on a GPU")
    return dev


def tune(prepared, intrin, target=None, *, trials=None, database=None, measure=True,
         progress=None, seed=0, top_k=6, patience=3, initial=10, runner=None,
         prior=None) -> TuneResult:
    """Tune the strategy of a Prepared op for `target` (CPU or CUDA); returns a TuneResult.

    database: a Database or a path; a hit returns its config without measuring anything.
    trials: most candidates measured (default: min(64, all)). measure=False with a database
    returns the default config when the database has no entry. progress: show a tqdm bar
    (default: on unless UNIT_TVM_QUIET is set). runner: where candidates run (default: this
    machine; a unit_tvm.fleet.RpcRunner measures them on the servers of a TVM RPC tracker, in
    parallel, and `target` defaults to theirs). prior: a database record of the same op whose
    loop nest may differ (the model pass's instruction choice); with measure=False and no record
    of this loop nest, its config is taken when this loop nest has it (a kernel whose arithmetic
    changed keeps its tuned loops).
    """
    if not isinstance(prepared, Prepared):
        raise TypeError(f"unit_tvm.tune takes the Prepared op from unit_tvm.prepare.prepare(op, "
                        f"intrinsic), got {type(prepared).__name__}")
    intrin = checks.intrinsic(intrin, "unit_tvm.tune")
    checks.count(trials, "trials", "unit_tvm.tune")
    target = target_for(target, runner)
    t0 = time.time()
    if database is not None and not isinstance(database, Database):
        database = Database(database)
    func = te.create_prim_func(list(prepared.params) + [prepared.reference])
    # another mapping of the same op and instruction is another loop nest: its own record
    key = workload_key(func) + (f"|{prepared.variant}" if prepared.variant else "")
    strategy = schedules.for_target(target)
    space = strategy.space(prepared, target)
    if database is not None:
        # the key names the op, not how it was prepared: a record tuned for an older layout of
        # it can name loops that no longer exist (a crash in tensorize), so it must be in today's
        # space
        hit = database.lookup(key, target, intrin.name,
                              accept=lambda rec: _config_of(strategy, rec) in space)
        if (hit is None and not measure and prior is not None
                and prior.get("intrinsic") == intrin.name and _config_of(strategy, prior) in space):
            hit = prior
        if hit is not None:
            return TuneResult(_config_of(strategy, hit), hit["gops"], True,
                              seconds=time.time() - t0)
    default = space[0]
    if not measure:
        return TuneResult(default, 0.0, False, seconds=time.time() - t0)
    runner = runner or LocalRunner(device_for(target), target)
    search = _Search(prepared, intrin, target, runner, seed, progress, min(trials or 64,
                                                                              len(space)))
    rng = random.Random(seed)
    # the strategy's seeds first (the default's neighbours on a GPU), then random configs
    first = [default] + [c for c in strategy.seeds(prepared, target) if c in space and c != default]
    others = [c for c in space if c not in first]
    search.run(first + rng.sample(others, min(len(others), max(0, initial - len(first)))))
    feats = {c: strategy.features(c, prepared, target) for c in space}
    model = CostModel(seed)
    measured = search.measured
    best_seen, stale = max(measured.values()), 0
    while len(measured) < search.trials and stale < patience:
        good = [c for c, g in measured.items() if g > 0]
        if len(good) >= 3:
            model.fit([feats[c] for c in good], [measured[c] for c in good])
        rest = [c for c in space if c not in measured]
        scores = model.predict([feats[c] for c in rest])
        ranked = [c for _, c in sorted(zip(scores, range(len(rest))), reverse=True)]
        search.run([rest[i] for i in ranked[: min(top_k, search.trials - len(measured))]])
        now = max(measured.values())
        stale = stale + 1 if now <= best_seen * 1.01 else 0
        best_seen = max(best_seen, now)
    search.close()
    search.final_round(default)
    best = max(measured, key=measured.get)
    if measured.get(default, 0.0) * KEEP_DEFAULT > measured[best]:
        best = default  # within the VM's noise of the default: not worth a different config
    if measured[best] <= 0:
        raise RuntimeError(f"every candidate failed for {prepared.original.op.name}: "
                           f"{search.rejected[:3]}")
    result = TuneResult(best, measured[best], False, len(measured), search.rejected,
                        time.time() - t0, search.history, dict(search.servers),
                        list(getattr(runner, "events", ())))
    if database is not None:
        database.append(key, target, intrin.name, best.key(), measured[best],
                        tuning_seconds=result.seconds, measured=len(measured),
                        device=runner.name)
    return result


FINAL_CANDIDATES = 4  # best configs timed again at the end of a search
FINAL_ROUNDS = 2
KEEP_DEFAULT = 1.03  # a tuned config must beat the default by more than this to replace it


class _Search:
    """The candidates of one tuning run: built here, measured through the runner in batches
    (a fleet measures a batch in parallel), every output checked against TVM's own build."""

    def __init__(self, prepared, intrin, target, runner, seed, progress, trials):
        self.prepared, self.intrin, self.target, self.runner = prepared, intrin, target, runner
        self.trials = trials
        self.arrays = _inputs(prepared, intrin, np.random.default_rng(seed))
        self.expected = reference_output(prepared, self.arrays, target)
        self.n_ops = _ops(prepared)
        self.measured, self.built, self.rejected, self.history = {}, {}, [], []
        self.servers = collections.Counter()
        show = progress if progress is not None else not os.environ.get("UNIT_TVM_QUIET")
        self.bar = tqdm.tqdm(total=trials, desc=f"tune {prepared.original.op.name} "
                             f"[{intrin.name}]", disable=not show, leave=False)

    def _reject(self, config, reason, routine=False):
        # a loop nest that cannot be tensorized is routine; a kernel that computes a wrong
        # result is not, and is always reported
        log.log(logging.INFO if routine else logging.WARNING, "candidate %s rejected: %s",
                config.key(), reason)
        self.rejected.append((config, reason))
        self.measured[config] = 0.0

    def run(self, configs):
        """Build, check and time `configs` (at most the trials left)."""
        configs = configs[: self.trials - len(self.measured)]
        libs, ready = [], []
        for config in configs:
            try:
                libs.append(candidate_module(self.prepared, self.intrin, config, self.target))
                ready.append(config)
            except Exception as e:  # noqa: BLE001 - a failed candidate is logged and discarded
                self._reject(config, failure(e), isinstance(e, tvm.s_tir.ScheduleError))
        results = self.runner.measure(libs, self.arrays, self.expected) if libs else []
        for config, lib, m in zip(ready, libs, results):
            if m.ok:
                self.measured[config] = self.n_ops / m.seconds / 1e9
                self.built[config] = lib
                self.servers[m.server] += 1
            else:
                self._reject(config, m.error)
        for config in configs:
            self.history.append((config.key(), self.measured[config]))
            self.bar.update(1)

    def close(self):
        self.bar.close()

    def final_round(self, default=None):
        """Time the best few configs and the default again, in turn, and keep each one's best:
        on a shared machine a burst of load during one measurement can put a good config
        behind a worse one (bench-op saw tuned configs 10-25% slower than the default they had
        beaten)."""
        measured = self.measured
        top = sorted((c for c in self.built if measured[c] > 0), key=measured.get,
                     reverse=True)[:FINAL_CANDIDATES]
        if default in self.built and measured[default] > 0 and default not in top:
            top.append(default)
        if len(top) < 2:
            return
        turns = top * FINAL_ROUNDS  # in turn: each config's second timing after the others'
        results = self.runner.measure([self.built[c] for c in turns], self.arrays, self.expected)
        for config, m in zip(turns, results):
            if m.ok:
                measured[config] = max(measured[config], self.n_ops / m.seconds / 1e9)


def _config_of(strategy, record):
    """The config a database record names, or None when it names none this strategy knows."""
    try:
        return strategy.from_key(record["config"])
    except (KeyError, TypeError, ValueError):
        return None


def _seconds(prepared, result):
    """Measured seconds of a TuneResult's config (its GOPS count the op's padded work)."""
    return _ops(prepared) / (result.gops * 1e9) if result.gops > 0 else float("inf")


def tune_instruction(alternatives, target=None, *, trials=None, database=None, measure=True,
                     progress=None, close=selection.RACE_CLOSE, most=selection.RACE_MOST,
                     runner=None):
    """Pick the instruction for one op, and its config: alternatives is [(intrin, prepared), ...]
    in preference order. Returns (index into alternatives, TuneResult).

    A database hit for any alternative decides without measuring (the fastest recorded one, or
    an earlier alternative within selection.RACE_KEEP of it). Without a hit: measure=False takes
    the first alternative with its default config; else every alternative's default config is
    built, checked against the reference and timed, then the fastest — and the next ones within
    `close` of it, `most` in all — is tuned and the fastest tuned one kept (with the same
    RACE_KEEP margin for an earlier one). Padding, register blocking and tile shapes make the
    static preference a guess: at 7x7 or one row, a 16-row AMX tile computes mostly padding and
    the 512-bit vpdpbusd wins by 2x. runner: where candidates run (see `tune`).
    """
    target = target_for(target, runner)
    if database is not None and not isinstance(database, Database):
        database = Database(database)
    if database is not None:
        hits = []
        for i, (intrin, prepared) in enumerate(alternatives):
            res = tune(prepared, intrin, target, database=database, measure=False)
            if res.from_database:
                hits.append((_seconds(prepared, res), i, res))
        if hits:
            return _preferred(hits)
    if not measure or len(alternatives) == 1:
        intrin, prepared = alternatives[0]
        return 0, tune(prepared, intrin, target, trials=trials, database=database,
                       measure=measure, progress=progress, runner=runner)
    raced = _race(alternatives, target, runner)
    if not raced:
        raise RuntimeError("no alternative instruction builds a correct kernel: "
                           + ", ".join(intrin.name for intrin, _ in alternatives))
    fastest = min(t for t, _ in raced)
    tuned = []
    for t, i in sorted(raced)[:most]:
        if t > fastest * close:
            break
        intrin, prepared = alternatives[i]
        res = tune(prepared, intrin, target, trials=trials, database=database, progress=progress,
                   runner=runner)
        tuned.append((_seconds(prepared, res), i, res))
    return _preferred(tuned)


def _preferred(entries, keep=selection.RACE_KEEP):
    """(index, TuneResult) of the earliest alternative whose seconds are within `keep` of the
    fastest, from [(seconds, index, TuneResult)]: a later one must win by more than the noise
    between two tuning runs (selection.RACE_KEEP)."""
    fastest = min(t for t, _, _ in entries)
    _, i, res = min((e for e in entries if e[0] <= fastest * keep), key=lambda e: e[1])
    return i, res


RACE_ROUNDS = 3  # each alternative's default config is timed this often, in turn


def _race(alternatives, target, runner=None):
    """[(seconds, index)] of every alternative whose default config builds a correct kernel,
    each the best of RACE_ROUNDS timings taken in turn. Each kernel is built and checked once,
    then timed round by round: a burst of load on a shared machine during one alternative's
    timings once sent a BERT dense to the 256-bit instruction at half the 512-bit one's speed
    (0.69 against 1.33 ms alone), and a round costs a timing, not a build."""
    runner = runner or LocalRunner(device_for(target), target)
    strategy = schedules.for_target(target)
    entrants = {}  # index -> (its search, its default config)
    for i, (intrin, prepared) in enumerate(alternatives):
        default = strategy.default(prepared, target)
        try:
            entrant = _Search(prepared, intrin, target, runner, 0, False, 1)
            entrant.run([default])
        except (RuntimeError, ValueError, tvm.s_tir.ScheduleError) as e:
            log.info("%s: default config failed: %s", intrin.name, str(e).splitlines()[0])
            continue
        entrant.close()
        if entrant.measured[default] > 0:
            entrants[i] = (entrant, default)
    best = {i: e.n_ops / e.measured[c] / 1e9 for i, (e, c) in entrants.items()}
    for _ in range(RACE_ROUNDS - 1):
        for i, (entrant, default) in list(entrants.items()):
            m = runner.measure([entrant.built[default]], entrant.arrays, entrant.expected)[0]
            if m.ok:
                best[i] = min(best[i], m.seconds)
            else:  # checked again on every timing: a kernel wrong once is out of the race
                log.warning("%s: default config failed: %s", entrant.intrin.name, m.error)
                del entrants[i], best[i]
    return [(t, i) for i, t in best.items()]

