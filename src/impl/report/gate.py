"""The regression gate (`make gate`): for each device and section, every measured row of the
newest stored run is compared, on pytest-benchmark's median, with the same row in the latest
earlier run that measured it with the same clock. A row slower by more than its noise band fails the gate unless
`reports/accepted-changes.toml` accepts it with a reason:

    [[accepted]]
    device = "h100-80gb-x1"
    section = "leaderboard"
    row = "test_leaderboard[flash_triton-fwd_bwd]"
    run = "20261124T101500Z_abcdef12"   # optional: the newest run's file stem; without it, every run
    reason = "why this row may be slower"

Noise bands (relative, per row) come from repeated identical runs: `python -m impl.report.gate
--bands A.json B.json ...` writes them to `reports/noise-bands.toml`; a row without one uses
DEFAULT_BAND for its device type. Both files are validated: an error names the file, the entry
and what is wrong. A run file that is not a whole run (impl.bench.store.read_run: truncated, NaN
or non-positive stats, failed tests...) fails the gate by name, so committed corruption is caught.
"""
from __future__ import annotations

import argparse
import math
import sys
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

from impl.bench.repo import add_repo_arguments, repo_from_args
from impl.bench.row import Status
from impl.bench.store import BadRunFile, run_files
from impl.report.data import Record, load_file
from impl.report.markdown import table
from impl.report.templating import macros

WORDS = macros("cli.txt.j2")
# The one default: GPU kernel and step rows repeat within a few % (README: measured bands). CPU
# smoke runs are not judged: on a shared 2-core machine two back-to-back runs moved by up to 120x
# (NOTES.md, "Bench layer"), so no band separates a regression from the machine's load.
DEFAULT_BAND = {"cuda": 0.10}
BAND_SAFETY = 1.5  # a measured band is this times the largest spread seen between identical runs
MIN_BAND = 0.02


@dataclass(frozen=True)
class Change:
    device: str
    section: str
    row: str
    old_run: str
    new_run: str
    old_s: float
    new_s: float
    band: float
    accepted: str | None

    @property
    def ratio(self) -> float:
        return self.new_s / self.old_s

    @property
    def regressed(self) -> bool:
        return self.ratio > 1 + self.band

    @property
    def verdict(self) -> str:
        if not self.regressed:
            return "faster" if self.ratio < 1 - self.band else "within band"
        return f"accepted: {self.accepted}" if self.accepted else "REGRESSION"


class ConfigError(ValueError):
    """A malformed accepted-changes.toml or noise-bands.toml: says the file, the entry and what is wrong."""


def _toml(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        return tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


@dataclass(frozen=True)
class Acceptance:
    """One [[accepted]] entry: the row may be slower than its band in `run` (every run if None)."""

    device: str
    section: str
    row: str
    reason: str
    run: str | None = None


def read_accepted(path: Path) -> list[Acceptance]:
    doc = _toml(path)
    if extra := set(doc) - {"accepted"}:
        raise ConfigError(f"{path}: unknown top-level key(s) {sorted(extra)}; only [[accepted]] entries belong here")
    entries = doc.get("accepted", [])
    if not isinstance(entries, list):
        raise ConfigError(f"{path}: 'accepted' must be a list of [[accepted]] tables")
    keys = [f.name for f in fields(Acceptance)]
    out = []
    for i, entry in enumerate(entries, 1):
        where = f"{path}: [[accepted]] entry {i}" + (f" (row {entry.get('row')!r})" if isinstance(entry, dict) else "")
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: not a table")
        if unknown := set(entry) - set(keys):
            raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)} (keys: {', '.join(keys)})")
        for key in ("device", "section", "row", "reason"):
            if not (isinstance(entry.get(key), str) and entry[key].strip()):
                raise ConfigError(f"{where}: {key!r} must be a non-empty string, got {entry.get(key)!r}")
        if not isinstance(entry.get("run", ""), str):
            raise ConfigError(f"{where}: 'run' must be a run file's stem (a string), got {entry['run']!r}")
        out.append(Acceptance(**entry))
    return out


def read_bands(path: Path) -> dict[str, dict[str, dict[str, float]]]:
    """device → section → row → relative band (a finite number > 0)."""
    doc = _toml(path)
    for device, by_section in doc.items():
        if not isinstance(by_section, dict):
            raise ConfigError(f"{path}: {device!r} must be a table of sections")
        for section, rows in by_section.items():
            if not isinstance(rows, dict):
                raise ConfigError(f"{path}: [{device}.{section}] must be a table of row = band")
            for row, band in rows.items():
                if isinstance(band, bool) or not isinstance(band, (int, float)) or not math.isfinite(band) or band <= 0:
                    raise ConfigError(f"{path}: [{device}.{section}] {row!r}: a band is a relative spread > 0 "
                                      f"(0.02 is 2%), got {band!r}")
    return doc


def _clock(rec: Record) -> str:
    """Which clock a median came from: rows are compared only with rows timed the same way (an
    older-format kernel row's figure is a do_bench median, a schema-2 row's its own rounds)."""
    return "older format" if rec.run.legacy else rec.row.timing.timer


def _measured(records: list[Record]) -> dict[str, Record]:
    return {r.name: r for r in records
            if r.row.status is Status.MEASURED and r.stats is not None and r.stats.median}


@dataclass
class Verdict:
    changes: list[Change]
    bad_files: list[BadRunFile] = field(default_factory=list)  # fail the gate: committed corruption


def compare(data_dir: Path, bands_path: Path | None = None,
            accepted_path: Path | None = None) -> Verdict:
    bands = read_bands(bands_path or data_dir.parent / "noise-bands.toml")
    # an entry naming a run accepts the change into that run only; without one, every run of the row
    accepted = {(a.device, a.section, a.row, a.run): a.reason
                for a in read_accepted(accepted_path or data_dir.parent / "accepted-changes.toml")}
    verdict = Verdict([])
    by_section: dict[tuple[str, str], list] = {}
    for rf in run_files(data_dir):
        try:  # every file is read, CPU ones too: a corrupt file fails the gate wherever it is
            rows = _measured(load_file(rf.path, rf.device, rf.section))
        except BadRunFile as exc:
            verdict.bad_files.append(exc)
            continue
        by_section.setdefault((rf.device, rf.section), []).append((rf, rows))
    changes = verdict.changes
    for (device, section), loaded in sorted(by_section.items()):
        loaded.sort(key=lambda pair: pair[0].stamp)
        runs = [rf for rf, _ in loaded]
        newest = loaded[-1][1]
        earlier = list(reversed(loaded[:-1]))
        if device == "cpu":
            continue
        default = DEFAULT_BAND["cuda"]
        for name, rec in sorted(newest.items()):
            prev = next(((rf, rows[name]) for rf, rows in earlier
                         if name in rows and _clock(rows[name]) == _clock(rec)), None)
            if prev is None:
                continue
            band = bands.get(device, {}).get(section, {}).get(name, default)
            changes.append(Change(device, section, name, prev[0].stamp, runs[-1].stamp, prev[1].stats.median,
                                  rec.stats.median, band, accepted.get((device, section, name, runs[-1].stamp))
                                  or accepted.get((device, section, name, None))))
    return verdict


def measure_bands(run_paths: list[Path], device: str, section: str) -> dict[str, float]:
    """Per row measured in two runs or more, BAND_SAFETY × the largest relative spread of the
    median across identical runs. ValueError for fewer than two distinct runs: one run has no spread."""
    if len({p.resolve() for p in run_paths}) < 2:
        raise ValueError(f"--bands needs at least two different runs of the same code, got {len(set(run_paths))}")
    medians: dict[str, list[float]] = {}
    for path in run_paths:
        for name, rec in _measured(load_file(path, device, section)).items():
            medians.setdefault(name, []).append(rec.stats.median)
    return {name: max(MIN_BAND, BAND_SAFETY * (max(m) / min(m) - 1)) for name, m in medians.items() if len(m) > 1}


def write_bands(path: Path, device: str, section: str, bands: dict[str, float]) -> None:
    """Adds or replaces these rows' bands; every other band in the file stays."""
    doc = read_bands(path)
    doc.setdefault(device, {}).setdefault(section, {}).update(bands)
    lines = ["# Relative noise band per row, from repeated identical runs (python -m impl.report.gate --bands).", ""]
    for dev in sorted(doc):
        for sec in sorted(doc[dev]):
            lines.append(f'[{dev!r}.{sec!r}]'.replace("'", '"'))
            lines += [f'"{name}" = {band:.4f}' for name, band in sorted(doc[dev][sec].items())]
            lines.append("")
    path.write_text("\n".join(lines))


def render(changes: list[Change]) -> str:
    rows = [[c.device, c.section, c.row, c.old_run, f"{c.old_s * 1e3:.4g}", f"{c.new_s * 1e3:.4g}",
             f"{100 * (c.ratio - 1):+.1f}%", f"±{100 * c.band:.0f}%", c.verdict] for c in changes]
    return table(WORDS.gate_header().split("|"), rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=WORDS.gate_description())
    add_repo_arguments(ap)
    ap.add_argument("--all", action="store_true", help=WORDS.gate_help_all())
    ap.add_argument("--bands", nargs="+", type=Path, metavar="RUN", help=WORDS.gate_help_bands())
    ap.add_argument("--device", help=WORDS.gate_help_device())
    ap.add_argument("--section", help=WORDS.gate_help_section())
    args = ap.parse_args(argv)
    data_dir = repo_from_args(ap, args).data_dir
    if args.bands:
        if not (args.device and args.section):
            ap.error(WORDS.gate_bands_needs())
        try:
            bands = measure_bands(args.bands, args.device, args.section)
            if not bands:
                raise ValueError(WORDS.gate_no_bands())
            write_bands(data_dir.parent / "noise-bands.toml", args.device, args.section, bands)
        except ValueError as exc:  # BadRunFile and ConfigError included: each names its file
            print(WORDS.gate_bands_error(exc), file=sys.stderr)
            return 1
        print(WORDS.gate_bands_written(len(bands), args.device, args.section, max(bands.values(), default=0)))
        return 0
    try:
        verdict = compare(data_dir)
    except ConfigError as exc:
        print(WORDS.gate_error(exc), file=sys.stderr)
        return 1
    changes = verdict.changes
    for exc in verdict.bad_files:
        print(WORDS.gate_corrupt(exc), file=sys.stderr)
    shown = changes if args.all else [c for c in changes if c.verdict != "within band"]
    print(WORDS.gate_summary(len(changes), len({(c.device, c.section) for c in changes})))
    if shown:
        print(render(shown))
    bad = [c for c in changes if c.regressed and not c.accepted]
    for c in bad:
        print(WORDS.gate_regression(c), file=sys.stderr)
    return 1 if bad or verdict.bad_files else 0


if __name__ == "__main__":
    sys.exit(main())
