"""Benchmark pictures that say where they were measured: the CPU, the date, how many runs
and their spread (median bars, min-max whiskers), the machine's load.

    python -m gpu_worker.bench.pictures     # redraws docs/bench/throughput*.png from
                                            # docs/bench/throughput-runs.json
"""
from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
from pathlib import Path

from kernels import cpuinfo

BENCH_DIR = Path(__file__).resolve().parents[2] / "docs" / "bench"
THROUGHPUT_BARS = [("naive_static_tok_s", "transformers\nstatic batches of 8", "#999"),
                   ("hf_continuous_tok_s", "transformers\ncontinuous batching", "#777"),
                   ("engine_mkl_tok_s", "this engine,\ntorch matmuls", "#8c8"),
                   ("engine_torch_ops_tok_s", "this engine,\nno C kernels", "#6b6"),
                   ("engine_tok_s", "this engine", "#2a7")]


def cpu_model() -> str:
    """The CPU's marketing name (Linux: /proc/cpuinfo), else what platform knows."""
    return cpuinfo.model_name()


def machine() -> dict:
    """What a benchmark JSON records about where and when it ran."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {"cpu": cpu_model(), "cpus": os.cpu_count(), "load_avg": [round(x, 2) for x in load],
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def spread(values: list[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    return statistics.median(values), min(values), max(values)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def machine_line(cpu: str, date: str, runs: int, load: list[float] | None = None) -> str:
    what = f"median of {runs} runs, whiskers min-max" if runs > 1 else "1 run (no spread)"
    text = f"{cpu} - {date} - {what}"
    return text + (f" - load avg {load[0]:.2f} on {os.cpu_count()} cores" if load else "")


def plot_throughput(runs: list[dict], *, cpu: str, date: str, path: Path, title: str,
                    limit: float | None = None, load: list[float] | None = None) -> Path:
    """One machine's runs: a bar per configuration at the median, whiskers at min and max."""
    plt = pyplot()
    bars = [b for b in THROUGHPUT_BARS if all(b[0] in r for r in runs)]
    stats = [spread([r[key] for r in runs]) for key, _, _ in bars]
    fig, ax = plt.subplots(figsize=(10, 5))
    medians = [s[0] for s in stats]
    errors = [[s[0] - s[1] for s in stats], [s[2] - s[0] for s in stats]]
    drawn = ax.bar([b[1] for b in bars], medians, color=[b[2] for b in bars],
                   yerr=errors if len(runs) > 1 else None, capsize=6, ecolor="#333")
    labels = [f"{m:.1f}" + (f"\n({lo:.0f}-{hi:.0f})" if len(runs) > 1 else "") for m, lo, hi in stats]
    ax.bar_label(drawn, labels=labels, padding=3, fontsize=8)
    if limit:
        ax.axhline(limit, color="#c44", linestyle="--", linewidth=1)
        ax.text(len(bars) - 0.5, limit, f"compute limit {limit:.0f} (last run)", color="#c44",
                ha="right", va="bottom", fontsize=8)
    ax.set_ylabel("useful output tokens / s")
    ax.set_ylim(0, max(limit or 0, max(s[2] for s in stats)) * 1.18)
    ax.set_title(f"{title}\n{machine_line(cpu, date, len(runs), load)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def throughput_title(result: dict, code: str | None = None) -> str:
    text = (f"{result['model']}, {result['requests']} mixed-length requests, "
            f"{result['threads']} CPU threads, fp32, torch {result['torch']}")
    return text + (f" ({code})" if code else "")


def redraw_throughput(bench_dir: Path = BENCH_DIR) -> list[Path]:
    """Every machine of throughput-runs.json, one picture each."""
    data = json.loads((bench_dir / "throughput-runs.json").read_text())
    written = []
    for entry in data["machines"]:
        last = json.loads((bench_dir / entry["json"]).read_text())
        written.append(plot_throughput(entry["runs"], cpu=entry["cpu"], date=entry["date"],
                                       path=bench_dir / entry["png"], limit=last.get("compute_limit_tok_s"),
                                       title=throughput_title(last, entry.get("code"))))
    return written


if __name__ == "__main__":
    for p in redraw_throughput(Path(sys.argv[1]) if len(sys.argv) > 1 else BENCH_DIR):
        print(p)
