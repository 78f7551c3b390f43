"""The chart of tokenspool against llama-server at 8, 16 and 32 streams, drawn from the paired
sections bench/paired.py wrote into bench/results/RESULTS.md (`--a defaults --b same<N>`): the median
ratio of aggregate tokens/s with its 95 % interval, per stream count; beside it the ceiling,
llama.cpp in-process against the same llama-server (bench/ceiling.py's sections), where
there is one.

    .venv/bin/python bench/lib/lead_chart.py [--results bench/results/RESULTS.md] \\
        [--out bench/results/RESULTS-lead.png]

Needs matplotlib (scripts/setup_peers installs it). Run by hand.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

SECTION = re.compile(r"<!-- paired-defaults-same(\d+)-(\d+) -->(.*?)<!-- /paired", re.S)
CEILING = re.compile(r"<!-- ceiling-same(\d+)-(\d+) -->(.*?)<!-- /ceiling", re.S)
CEILING_ROW = re.compile(r"\| in-process / server \| ([\d.]+) \| ([\d.]+) - ([\d.]+) \|")
ROW = re.compile(r"\| aggregate tok/s \| ([\d.]+) \| ([\d.]+) - ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|")


def read(results: Path) -> list[tuple[int, float, float, float, float, float]]:
    """(streams, median ratio, low, high, tokenspool tok/s, llama-server tok/s) per section."""
    found = []
    for _, streams, body in SECTION.findall(results.read_text()):
        m = ROW.search(body)
        if m:
            found.append((int(streams), *(float(g) for g in m.groups())))
    return sorted(found)


def ceilings(results: Path) -> dict[int, tuple[float, float, float]]:
    """Streams -> (median ratio, low, high) of the in-process run over llama-server."""
    found = {}
    for _, streams, body in CEILING.findall(results.read_text()):
        if m := CEILING_ROW.search(body):
            found[int(streams)] = (float(m[1]), float(m[2]), float(m[3]))
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default="bench/results/RESULTS.md")
    ap.add_argument("--out", default="bench/results/RESULTS-lead.png")
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = read(Path(args.results))
    if not points:
        raise SystemExit("no paired defaults/same<N> sections in the results: run bench/paired.py first")
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    labels = [str(p[0]) for p in points]
    left.bar(
        [i - 0.2 for i in range(len(points))],
        [p[4] for p in points],
        0.4,
        label="tokenspool (no size settings)",
    )
    left.bar(
        [i + 0.2 for i in range(len(points))],
        [p[5] for p in points],
        0.4,
        label="llama-server -np N (same llama.cpp)",
    )
    left.set_xticks(range(len(points)), labels)
    left.set_xlabel("concurrent streams")
    left.set_ylabel("aggregate tokens/s (median of pairs)")
    left.legend(fontsize=8, loc="lower center")
    right.errorbar(
        labels,
        [p[1] for p in points],
        yerr=[[p[1] - p[2] for p in points], [p[3] - p[1] for p in points]],
        fmt="o",
        capsize=4,
        label="tokenspool",
    )
    top = ceilings(Path(args.results))
    if shown := [(str(p[0]), top[p[0]]) for p in points if p[0] in top]:
        right.errorbar(
            [label for label, _ in shown],
            [c[0] for _, c in shown],
            yerr=[[c[0] - c[1] for _, c in shown], [c[2] - c[0] for _, c in shown]],
            fmt="s",
            capsize=4,
            color="grey",
            label="ceiling: llama.cpp in-process",
        )
    right.axhline(1.0, color="grey", lw=0.8)
    right.axhline(1.05, color="green", lw=0.8, ls="--", label="goal 1.05x")
    right.set_xlabel("concurrent streams")
    right.set_ylabel("over llama-server (95 % interval)")
    right.legend(fontsize=8)
    fig.suptitle("Aggregate tokens/s, paired runs, 2 vCPUs, SmolLM2-135M Q4_1, 128 tokens a stream")
    fig.tight_layout()
    fig.savefig(args.out, dpi=90)
    print(f"wrote {args.out}: " + ", ".join(f"{p[0]} streams {p[1]:.3f}x" for p in points))


if __name__ == "__main__":
    main()
