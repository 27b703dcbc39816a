"""Summaries of a fuzzing run: kind x outcome, instructions used, tensorized share, failures."""

from collections import Counter
from dataclasses import asdict, dataclass

from .outcome import CLASSES, CaseResult

FAILURES = ("wrong", "crash", "hard-crash", "timeout")


@dataclass(frozen=True)
class FuzzReport:
    """Every case's result plus how long the run took."""

    seed: int
    results: tuple  # CaseResult, in case order
    seconds: float

    @property
    def failures(self) -> list:
        """Cases that were wrong, crashed or hung."""
        return [r for r in self.results if r.outcome in FAILURES]

    def counts(self) -> dict:
        """{kind: Counter(outcome)} plus 'all'."""
        table = {}
        for r in self.results:
            table.setdefault(r.kind, Counter())[r.outcome] += 1
        table["all"] = sum(table.values(), Counter())
        return table

    def tensorized_share(self) -> dict:
        """{kind: tensorized cases / cases that ran} (wrong results count as not tensorized)."""
        out = {}
        for kind, c in self.counts().items():
            ran = c["tensorized-correct"] + c["fallback-correct"] + c["wrong"]
            out[kind] = c["tensorized-correct"] / ran if ran else 0.0
        return out

    def instructions(self) -> Counter:
        """How many correct tensorized cases each instruction (and mapping) computed."""
        return Counter(r.intrinsic + (f" [{r.mapping}]" if r.mapping else "")
                       for r in self.results if r.outcome == "tensorized-correct")

    def as_json(self) -> dict:
        """Plain data for --json."""
        return {"seed": self.seed, "seconds": self.seconds,
                "cases_per_minute": self.cases_per_minute(),
                "counts": {k: dict(v) for k, v in self.counts().items()},
                "tensorized_share": self.tensorized_share(),
                "instructions": dict(self.instructions()),
                "results": [asdict(r) for r in self.results]}

    def cases_per_minute(self) -> float:
        """Throughput of the run."""
        return 60.0 * len(self.results) / self.seconds if self.seconds else 0.0


def result_line(r: CaseResult) -> str:
    """One line per case for the live log."""
    how = r.intrinsic + (f" [{r.mapping}]" if r.mapping else "") if r.intrinsic else "fallback"
    text = f"#{r.index:<5} {r.outcome:<18} {how:<28} {r.description}"
    if r.outcome in FAILURES:
        text += f"\n       {r.detail}\n       reproduce: {r.reproduce}"
    return text


def table(report: FuzzReport) -> str:
    """The kind x outcome table, the tensorized share per kind and the instructions used."""
    counts, share = report.counts(), report.tensorized_share()
    cols = [c for c in CLASSES if c != "invalid" or counts["all"][c]]
    head = f"{'kind':<14}" + "".join(f"{c:>20}" for c in cols) + f"{'tensorized':>12}"
    lines = [head, "-" * len(head)]
    for kind in sorted(k for k in counts if k != "all") + ["all"]:
        c = counts[kind]
        lines.append(f"{kind:<14}" + "".join(f"{c[x]:>20}" for x in cols)
                     + f"{100 * share[kind]:>11.1f}%")
    lines.append("")
    lines.append(f"{len(report.results)} cases in {report.seconds:.0f} s "
                 f"({report.cases_per_minute():.1f} cases/min), seed {report.seed}")
    used = report.instructions()
    if used:
        lines.append("instructions: " + ", ".join(f"{k} {n}" for k, n in used.most_common()))
    fails = report.failures
    lines.append(f"failures: {len(fails)}" if fails else "failures: none")
    for r in fails:
        lines.append(f"  {r.outcome}: {r.description}\n    {r.detail}\n"
                     f"    reproduce: {r.reproduce}")
    return "\n".join(lines)
