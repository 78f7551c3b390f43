"""Every benchmark's figures as JSON, and the one way they become charts and tables.

    python -m bench.lib.charts FILE.json [--png OUT.png] [--markdown]

bench/peers.py, bench/paired.py and bench/gpu_run each write their results into a JSON file
(a section per comparison, the others kept, as their Markdown sections are), each result
one server at one concurrency: `{"server", "streams", "tok_s_total", "ttft_p50", "ttft_p95",
"itl_p50", "itl_p99", "ok", ...}`. This module draws any such file: aggregate output tokens/s
and TTFT p95 against concurrency, every server of a section beside the others (tokenspool
beside each peer), a row of panels per section; and writes its Markdown table. Needs
matplotlib for the PNG (the test extra has it).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

FIGURES = (("tok_s_total", "aggregate output tokens/s", 1.0), ("ttft_p95", "TTFT p95 (ms)", 1000.0))


def record(path: Path, section: str, entry: dict) -> None:
    """Write one comparison's section (`{"title", "command", "machine", "date", "results":
    [...]}`) of a results file, keeping the others."""
    data = json.loads(path.read_text()) if path.exists() else {}
    data[section] = entry
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def series(entry: dict) -> dict[str, list[dict]]:
    """Server -> its results, by concurrency."""
    out: dict[str, list[dict]] = {}
    for r in entry.get("results", []):
        out.setdefault(r["server"], []).append(r)
    return {s: sorted(rs, key=lambda r: r["streams"]) for s, rs in out.items()}


def draw(
    data: dict,
    png: Path,
    figures: tuple[tuple[str, str, float], ...] = FIGURES,
    x_label: str = "concurrent streams",
) -> None:
    """Each section a row: aggregate tokens/s and TTFT p95 (or `figures`: (key, label,
    scale) each) against concurrent streams (or what `streams` counts, `x_label`), from 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sections = [(name, entry) for name, entry in data.items() if entry.get("results")]
    if not sections:
        raise SystemExit("no results to draw")
    width = 5.5 * len(figures)
    fig, axes = plt.subplots(len(sections), len(figures), figsize=(width, 3.6 * len(sections)), squeeze=False)
    for row, (name, entry) in zip(axes, sections, strict=True):
        streams = sorted({r["streams"] for r in entry["results"]})
        for server, rs in series(entry).items():
            for ax, (key, label, scale) in zip(row, figures, strict=True):
                points = [(r["streams"], r[key] * scale) for r in rs if _finite(r.get(key))]
                if points:
                    ax.plot(*zip(*points, strict=True), marker="o", label=server)
                ax.set_title(f"{entry.get('title', name)}\n{label}", fontsize=9)
        for ax in row:
            if len(streams) > 1:
                ax.set_xscale("log", base=2)
            ax.set_xticks(streams, [str(s) for s in streams])
            ax.set_xlabel(x_label)
            ax.set_ylim(bottom=0)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def markdown(data: dict) -> list[str]:
    """Each section's notes (lines the script wrote: a ratio, a verdict) and its table, a row
    per server and concurrency."""
    lines: list[str] = []
    for name, entry in data.items():
        lines += [f"### {entry.get('title', name)}", ""]
        if entry.get("command"):
            lines.append(f"Command: `{entry['command']}`. Machine: {entry.get('machine', '?')}.")
            lines.append("")
        for note in entry.get("notes", []):
            lines += [note, ""]
        if not entry.get("results"):
            continue
        lines += [
            "| server | streams | completed | tok/s total | TTFT p50 / p95 ms | ITL p50 / p99 ms |",
            "|---|---|---|---|---|---|",
        ]
        for server, rs in series(entry).items():
            for r in rs:
                lines.append(
                    f"| {server} | {r['streams']} | {r.get('ok', '?')}/{r.get('of', r['streams'])} "
                    f"| {r['tok_s_total']:.1f} | {_ms(r.get('ttft_p50'))} / {_ms(r.get('ttft_p95'))} "
                    f"| {_ms(r.get('itl_p50'), 1)} / {_ms(r.get('itl_p99'), 1)} |"
                )
        lines.append("")
    return lines


def _ms(seconds: object, digits: int = 0) -> str:
    return f"{seconds * 1000:.{digits}f}" if _finite(seconds) else "-"  # type: ignore[operator]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--png", type=Path)
    ap.add_argument("--markdown", action="store_true", help="print the tables")
    args = ap.parse_args()
    data = json.loads(args.results.read_text())
    png = args.png or args.results.with_suffix(".png")
    draw(data, png)
    print(f"wrote {png}")
    if args.markdown:
        print("\n".join(markdown(data)))


if __name__ == "__main__":
    main()
