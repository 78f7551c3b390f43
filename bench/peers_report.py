"""bench/peers.py's report: the Markdown tables (with the command and the machine) and the
PNG of latency against concurrency, from the figures the runs collected."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path


def cells(r: dict) -> list[str]:
    errs = f" ({', '.join(r['errors'])})" if r["errors"] else ""
    return [
        f"{r['ok']}/{r['streams']}{errs}",
        f"{r['ttft_p50'] * 1000:.0f} / {r['ttft_p99'] * 1000:.0f}",
        f"{r['itl_p50'] * 1000:.1f} / {r['itl_p99'] * 1000:.1f}",
        f"{r['tok_s_stream']:.1f}",
        f"{r['tok_s_total']:.1f}",
        f"{r['rss_mb']:.0f}",
    ]


def write_results(path: Path, table: dict[str, dict[str, dict]], runs: int, names: list[str]) -> None:
    ts = "tokenspool (1 worker)"
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in ln
        ),
        platform.processor(),
    )
    lines = [
        "# tokenspool next to the servers users run instead",
        "",
        f"Command: `.venv/bin/python bench/peers.py --runs {runs}` (after `bench/setup_peers`), "
        f"{time.strftime('%Y-%m-%d')}.",
        f"Machine: {os.cpu_count()} vCPUs ({cpu}), {_mem_gb():.0f} GiB, no GPU; one llama.cpp thread "
        "per server, SmolLM2-135M-Instruct Q4_1, greedy, 128 output tokens, context 4096 per sequence.",
        f"Each figure is the median of {runs} alternated runs (one run for the crash); TTFT and ITL "
        "in ms as p50 / p99; tok/s per stream (median) and aggregate; RSS is the peak of all of a "
        "server's processes (tokenspool: Redis + API + workers).",
        "",
    ]
    head = "| server | completed | TTFT ms | ITL ms | tok/s per stream | tok/s total | peak RSS MB |"
    head += " tokenspool (1 worker) / this: TTFT, tok/s per stream |"
    for label, row in table.items():
        lines += [f"## {label}", "", head, "|---|---|---|---|---|---|---|---|"]
        base = row.get(ts)
        for name in names:
            r = row[name]
            ratio = ""
            if base and name != ts and r["ttft_p50"] == r["ttft_p50"] and r["tok_s_stream"]:
                ttft_ratio = base["ttft_p50"] / r["ttft_p50"]
                ratio = f"{ttft_ratio:.2f}, {base['tok_s_stream'] / r['tok_s_stream']:.2f}"
            lines.append("| " + " | ".join([name, *cells(r), ratio]) + " |")
        lines.append("")
    path.write_text("\n".join(lines) + "\n")
    plot(path.with_suffix(".png"), table, names)
    print(f"wrote {path} and {path.with_suffix('.png')}")


def plot(path: Path, table: dict[str, dict[str, dict]], names: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = [("1 stream, short prompt", 1), ("8 streams", 8), ("32 streams", 32)]
    if not any(label in table for label, _ in levels):
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name in names:
        xs = [n for label, n in levels if label in table]
        ttft = [table[label][name]["ttft_p50"] * 1000 for label, _ in levels if label in table]
        itl50 = [table[label][name]["itl_p50"] * 1000 for label, _ in levels if label in table]
        itl99 = [table[label][name]["itl_p99"] * 1000 for label, _ in levels if label in table]
        ax1.plot(xs, ttft, marker="o", label=name)
        (line,) = ax2.plot(xs, itl50, marker="o", label=f"{name} p50")
        ax2.plot(xs, itl99, marker="x", linestyle="--", color=line.get_color(), label=f"{name} p99")
    for ax, title in ((ax1, "time to first token p50 (ms)"), (ax2, "inter-token latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 8, 32], ["1", "8", "32"])
        ax.set_xlabel("concurrent streams")
        ax.set_yscale("log")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _mem_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 1024 / 1024
    return 0.0
