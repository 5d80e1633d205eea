"""`python -m impl.report`: rebuilds reports/README.md and reports/figures/ from reports/data/**."""
from __future__ import annotations

import sys
from pathlib import Path

from impl.report import sections
from impl.report.data import load, load_history

ROOT = Path(__file__).resolve().parents[3]


class SharedRecords(list):
    """Read-only records carried in DataFrame.attrs: pandas deep-copies attrs into every derived
    frame, which for a history of hundreds of benchmark rows made the report take minutes; these
    are shared instead of copied."""

    def __deepcopy__(self, memo):
        return self


def build(root: Path = ROOT) -> str:
    data_dir, fig_dir = root / "reports" / "data", root / "reports" / "figures"
    df, history = load(data_dir), load_history(data_dir)
    out = ["# Report",
           "Built by `make report` from the saved pytest-benchmark JSON under `reports/data/<device>/`; "
           "every number below is read from those files. Do not edit by hand."]
    if df.empty:
        out.append("No benchmark data yet: run `make perf`.")
        return "\n\n".join(out) + "\n"
    # GPU folders first: they hold the assignment's answers; the CPU folder is the smoke baseline.
    devices = sorted(df.device.unique(), key=lambda d: (d == "cpu", d))
    for device in devices:
        dd = df[df.device == device]
        # earlier versions of this device's benchmarks (as records: pandas compares attrs when it
        # propagates them), for the sections that show a version history
        dd.attrs["history"] = SharedRecords([] if history.empty else history[history.device == device].to_dict("records"))
        env = dd["row"].iloc[-1].env  # the newest row's environment
        out.append(f"# Device: {device}")
        out.append(f"{env.device} · torch {env.torch} · triton {env.triton} · CUDA {env.cuda} · profile `{env.profile}`")
        for render in sections.ALL:
            text = render(dd, device, fig_dir, "figures")
            if text:
                out.append(text)
    return "\n\n".join(out) + "\n"


def main() -> int:
    text = build()
    (ROOT / "reports" / "README.md").write_text(text)
    print(f"wrote {ROOT / 'reports' / 'README.md'} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
