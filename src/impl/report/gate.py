"""The regression gate (`make gate`, README step 3): each stored GPU row's newest measurement (in whichever run
measured it last, so a later `-k` run hides no row) against its previous one timed with the same clock, on
pytest-benchmark's median. A row slower than its noise band (`--bands`, from identical runs, into
reports/noise-bands.toml) fails unless an [[accepted]] entry of reports/accepted-changes.toml (device, section,
row, reason and, optionally, the slower run's stem) accepts it; a run file that is not whole fails by name. A row
host-bound in its newest measurement (its host_ms metric) is judged with HOST_BOUND_BAND instead, and named so.
"""
from __future__ import annotations

import argparse
import math
import sys
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

from impl.bench.repo import add_repo_arguments, repo_from_args
from impl.bench.row import Metric, Status
from impl.bench.timers import host_bound
from impl.bench.store import BadRunFile, read_run, run_identity
from impl.report.data import Copy, load_doc, load_stored
from impl.report.rows import Bench
from impl.report.markdown import table

# The one default: GPU kernel and step rows repeat within a few % (README: measured bands). CPU
# smoke runs are not judged: on a shared 2-core machine two back-to-back runs moved by up to 120x
# (NOTES.md, "Bench layer"), so no band separates a regression from the machine's load.
DEFAULT_BAND = {"cuda": 0.10}
BAND_SAFETY = 1.5  # a measured band is this times the largest spread seen between identical runs
MIN_BAND = 0.02
# A band lets a row take (1 + band) times as long before it fails. Beyond 2 (three times as long)
# it judges nothing; the widest measured so far is 1.32 (flash_shapes' host-bound d80 rows).
MAX_BAND = 2.0
# A host-bound row (impl.bench.timers.host_bound: the host's enqueue time at least 80% of its median) times the
# host's launch path, which moved by up to 2.5x between machines with the code unchanged (NOTES.md, the flash_shapes
# runs): it is judged with this band, and fails only beyond it. Only the newest measurement counts: a row slower now
# and device-bound took longer on the device than its previous median, host-bound or not, allowed.
HOST_BOUND_BAND = 1.5


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
    host_bound: bool = False  # the newest measurement (HOST_BOUND_BAND)

    ratio = property(lambda self: self.new_s / self.old_s)
    limit = property(lambda self: max(self.band, HOST_BOUND_BAND) if self.host_bound else self.band)
    regressed = property(lambda self: self.ratio > 1 + self.limit)

    @property
    def verdict(self) -> str:
        if not self.regressed:
            if self.ratio < 1 - self.band:
                return "faster"
            return "host-bound: within its host band" if self.ratio > 1 + self.band else "within band"
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
    for i, entry in enumerate(entries, 1):
        if not isinstance(entry, dict):
            raise ConfigError(f"{path}: [[accepted]] entry {i}: not a table")
        where = f"{path}: [[accepted]] entry {i} (row {entry.get('row')!r})"
        if unknown := set(entry) - set(keys):
            raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)} (keys: {', '.join(keys)})")
        for key in ("device", "section", "row", "reason"):
            if not (isinstance(entry.get(key), str) and entry[key].strip()):
                raise ConfigError(f"{where}: {key!r} must be a non-empty string, got {entry.get(key)!r}")
        if not isinstance(entry.get("run", ""), str):
            raise ConfigError(f"{where}: 'run' must be a run file's stem (a string), got {entry['run']!r}")
    return [Acceptance(**entry) for entry in entries]


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
                if (isinstance(band, bool) or not isinstance(band, (int, float)) or not math.isfinite(band)
                        or not 0 < band <= MAX_BAND):
                    raise ConfigError(f"{path}: [{device}.{section}] {row!r}: a band is a relative spread > 0 "
                                      f"and <= {MAX_BAND} (0.02 is 2%), got {band!r}")
    return doc


def _clock(rec: Bench) -> str:
    """Which clock a median came from (an older-format kernel row's is do_bench's, a schema-2 row's its rounds)."""
    return "older format" if rec.run.legacy else rec.row.timing.timer


def _measured(records: list[Bench]) -> dict[str, Bench]:
    return {r.name: r for r in records
            if r.row.status is Status.MEASURED and r.stats is not None and r.stats.median}


@dataclass
class Histories:
    """What the stored runs hold, by (device, section): each row's measurements as (run stem, record), oldest
    first; and the runs that have each row in any status (what the gate's configuration may name)."""

    measured: dict[tuple[str, str], dict[str, list[tuple[str, Bench]]]] = field(default_factory=dict)
    rows: dict[tuple[str, str], dict[str, set[str]]] = field(default_factory=dict)

    @classmethod
    def of(cls, runs) -> Histories:
        out = cls()
        for run in runs:  # file order: oldest first within a folder
            where, stamp = (run.file.device, run.file.section), run.file.stamp
            for rec in run.rows:
                out.rows.setdefault(where, {}).setdefault(rec.name, set()).add(stamp)
            for name, rec in _measured(run.rows).items():
                out.measured.setdefault(where, {}).setdefault(name, []).append((stamp, rec))
        return out

    def where_unknown(self, device: str, section: str, row: str | None = None, run: str | None = None) -> str | None:
        """What of (device, section, row, run) no stored run has, in words; None where all exist."""
        devices = sorted({d for d, _ in self.rows})
        if device not in devices:
            return f"no stored runs of device {device!r} (devices: {', '.join(devices)})"
        if (device, section) not in self.rows:
            sections = sorted(s for d, s in self.rows if d == device)
            return f"no stored {device} runs of section {section!r} (sections: {', '.join(sections)})"
        rows = self.rows[(device, section)]
        if run is not None and not any(run in runs for runs in rows.values()):
            return f"no stored {device}/{section} run {run!r}"
        if row is not None and row not in rows:
            return f"no row {row!r} in any stored {device}/{section} run"
        if row is not None and run is not None and run not in rows[row]:
            return f"row {row!r} is not in the run {run!r}"
        return None


@dataclass
class Verdict:
    changes: list[Change]
    bad_files: list[BadRunFile] = field(default_factory=list)  # fail the gate: committed corruption or misplaced runs
    copies: list[Copy] = field(default_factory=list)  # a run's second file: ignored, named


def compare(data_dir: Path, bands_path: Path | None = None,
            accepted_path: Path | None = None) -> Verdict:
    bands_path = bands_path or data_dir.parent / "noise-bands.toml"
    accepted_path = accepted_path or data_dir.parent / "accepted-changes.toml"
    bands, entries = read_bands(bands_path), read_accepted(accepted_path)
    stored = load_stored(data_dir)  # every file is read, CPU ones too: a bad file fails the gate wherever it is
    known = Histories.of(stored.runs)
    for device, by_section in bands.items():  # each band and entry names what a stored run has
        for section, rows in by_section.items():
            for row in [None, *rows]:
                if why := known.where_unknown(device, section, row):
                    raise ConfigError(f"{bands_path}: [{device}.{section}]{f' {row!r}' if row else ''}: {why}")
    for i, a in enumerate(entries, 1):
        if why := known.where_unknown(a.device, a.section, a.row, a.run):
            raise ConfigError(f"{accepted_path}: [[accepted]] entry {i} (row {a.row!r}): {why}")
    # an entry naming a run accepts the change into that run only; without one, every run of the row
    accepted = {(a.device, a.section, a.row, a.run): a.reason for a in entries}
    changes = []
    for (device, section), rows in sorted(known.measured.items()):
        for name, history in sorted(rows.items()) if device != "cpu" else ():
            new_run, new = history[-1]
            # the previous measurement is the latest earlier one timed with the same clock
            prev = next(((run, rec) for run, rec in reversed(history[:-1]) if _clock(rec) == _clock(new)), None)
            if prev is None:
                continue
            band = bands.get(device, {}).get(section, {}).get(name, DEFAULT_BAND["cuda"])
            changes.append(Change(device, section, name, prev[0], new_run, prev[1].stats.median, new.stats.median, band,
                                  accepted.get((device, section, name, new_run))
                                  or accepted.get((device, section, name, None)),
                                  host_bound(new.stats.median, new.metric(Metric.HOST_MS))))
    return Verdict(changes, stored.bad, stored.copies)


def measure_bands(run_paths: list[Path], device: str, section: str) -> dict[str, float]:
    """Per row measured in two runs or more, BAND_SAFETY × the largest relative spread of its median; ValueError
    for fewer than two runs, a copy, a run of another device or section, or a band beyond MAX_BAND."""
    docs = [(path, read_run(path, section, device)) for path in run_paths]
    first: dict[str | None, Path] = {}
    for path, doc in docs:
        if (identity := run_identity(doc)) in first:
            raise ValueError(f"{path} and {first[identity]} are the same run (the same start time): "
                             "a copy has no spread")
        first[identity] = path
    if len(docs) < 2:
        raise ValueError(f"--bands needs at least two different runs of the same code, got {len(docs)}")
    medians: dict[str, list[float]] = {}
    for path, doc in docs:
        for name, rec in _measured(load_doc(doc, path, device, section)).items():
            medians.setdefault(name, []).append(rec.stats.median)
    bands = {name: max(MIN_BAND, BAND_SAFETY * (max(m) / min(m) - 1)) for name, m in medians.items() if len(m) > 1}
    if wide := {name: band for name, band in bands.items() if band > MAX_BAND}:
        raise ValueError(f"bands beyond {MAX_BAND} (the runs were not identical): "
                         + ", ".join(f"{name} {band:.2f}" for name, band in sorted(wide.items())))
    return bands


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Judge each stored row's newest measurement against its previous one.")
    add_repo_arguments(ap)
    ap.add_argument("--all", action="store_true", help="print every compared row, not only changes beyond bands")
    ap.add_argument("--bands", nargs="+", type=Path, metavar="RUN", help="measure noise bands from identical runs")
    ap.add_argument("--device", help="with --bands: the device slug")
    ap.add_argument("--section", help="with --bands: the section")
    args = ap.parse_args(argv)
    data_dir = repo_from_args(ap, args).data_dir
    if args.bands:
        if not (args.device and args.section):
            ap.error("--bands needs --device and --section")
        try:
            bands = measure_bands(args.bands, args.device, args.section)
            if not bands:
                raise ValueError("no row is measured in two of these runs: the bands are left as they were")
            write_bands(data_dir.parent / "noise-bands.toml", args.device, args.section, bands)
        except ValueError as exc:  # BadRunFile and ConfigError included: each names its file
            print(f"gate --bands: {exc}", file=sys.stderr)
            return 1
        print(f"wrote {len(bands)} bands for {args.device}/{args.section}; largest {max(bands.values()):.1%}")
        return 0
    try:
        verdict = compare(data_dir)
    except ConfigError as exc:
        print(f"gate: {exc}", file=sys.stderr)
        return 1
    changes = verdict.changes
    for exc in verdict.bad_files:
        print(f"gate: CORRUPT run file {exc}", file=sys.stderr)
    for copy in verdict.copies:
        print(f"gate: ignored {copy}", file=sys.stderr)
    shown = changes if args.all else [c for c in changes if c.verdict != "within band"]
    print(f"gate: {len(changes)} rows compared across {len({(c.device, c.section) for c in changes})} sections")
    if shown:
        print(table(["device", "section", "row", "previous run", "previous median (ms)", "newest median (ms)", "change",
                     "band", "verdict"],
                    [[c.device, c.section, c.row, c.old_run, f"{c.old_s * 1e3:.4g}", f"{c.new_s * 1e3:.4g}",
                      f"{100 * (c.ratio - 1):+.1f}%",
                      f"±{100 * c.band:.0f}%" + (f" (host-bound: ±{100 * c.limit:.0f}%)" if c.host_bound else ""),
                      c.verdict] for c in shown]))
    bad = [c for c in changes if c.regressed and not c.accepted]
    for c in bad:
        print(f"gate: REGRESSION {c.device}/{c.section} {c.row}: {c.old_s * 1e3:.4g} -> {c.new_s * 1e3:.4g} ms "
              f"({100 * (c.ratio - 1):+.1f}%, band ±{100 * c.limit:.0f}%{', host-bound' if c.host_bound else ''}); "
              "accept it in reports/accepted-changes.toml "
              "with a reason if intended", file=sys.stderr)
    return 1 if bad or verdict.bad_files else 0


if __name__ == "__main__":
    sys.exit(main())
