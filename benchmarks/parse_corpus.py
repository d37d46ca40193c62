"""How many real nccl-tests outputs the parser reads with every row.

    python benchmarks/parse_corpus.py [--check] [--min-rate 0.95]

The corpus is tests/data/nccltests-corpus/: outputs published in public repositories (where each
came from: SOURCES.csv), and expected.csv, the runs and table rows each file holds, counted from
the files independently of the parser. Every file is read as ``ncclrl parse`` reads it (leniently,
its default); a file counts as read when the parser returns exactly its runs and rows. Prints one line per
file not read and why, then the totals and the rate (files read / files); ``--check`` exits 1 when
the rate is below ``--min-rate``.
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass
from pathlib import Path

from ncclrl.costmodel.nccltests import NcclTestsError, parse_file_runs

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "data" / "nccltests-corpus"


@dataclass
class Outcome:
    file: str
    runs_expected: int
    rows_expected: int
    runs: int = 0
    rows: int = 0
    strict_ok: bool = False
    error: str = ""

    @property
    def read(self) -> bool:
        return not self.error and (self.runs, self.rows) == (self.runs_expected, self.rows_expected)

    @property
    def why(self) -> str:
        if self.error:
            return self.error
        return f"{self.runs} runs, {self.rows} rows; expected {self.runs_expected} runs, {self.rows_expected} rows"


def expected(corpus: Path = CORPUS) -> list[tuple[str, int, int]]:
    with open(corpus / "expected.csv", newline="") as f:
        return [(r["file"], int(r["runs"]), int(r["rows"])) for r in csv.DictReader(f)]


def check(corpus: Path = CORPUS) -> list[Outcome]:
    """Each corpus file against expected.csv."""
    out = []
    for name, runs, rows in expected(corpus):
        o = Outcome(name, runs, rows)
        try:
            got = parse_file_runs(corpus / name, strict=False)
            o.runs, o.rows = len(got), sum(len(r.records) for r in got)
        except NcclTestsError as e:
            o.error = str(e)
        try:
            parse_file_runs(corpus / name, strict=True)
            o.strict_ok = True
        except NcclTestsError:
            pass
        out.append(o)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when the rate is below --min-rate")
    ap.add_argument("--min-rate", type=float, default=0.95)
    args = ap.parse_args(argv)
    outcomes = check()
    files = len(outcomes)
    read = [o for o in outcomes if o.read]
    for o in outcomes:
        if not o.read:
            print(f"not read: {o.file}: {o.why}")
    rate = len(read) / files if files else 0.0
    print(f"files: {files}")
    print(f"rows expected: {sum(o.rows_expected for o in outcomes)}, rows read: {sum(o.rows for o in outcomes)}")
    print(f"files read with every row: {len(read)}")
    print(f"files that pass the strict check too (complete runs, no NCCL WARN): "
          f"{sum(o.strict_ok for o in outcomes)}")
    print(f"rate: {rate:.3f}")
    if args.check and rate < args.min_rate:
        print(f"rate {rate:.3f} < {args.min_rate}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
