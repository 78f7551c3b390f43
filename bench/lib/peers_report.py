"""bench/peers.py's report: the Markdown tables (with the command and the machine), and the
same figures as JSON with their chart (bench/lib/charts.py)."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

from bench.lib import charts


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


BASELINE = {"peers": "tokenspool (1 worker)", "batching": "tokenspool (1 worker, SLOTS=8)"}
TITLE = {
    "peers": "tokenspool next to llama-cpp-python's server and llama-server",
    "batching": "Continuous batching: one batching worker, one single-sequence worker, and the peers",
}


def write_results(
    path: Path,
    which: str,
    table: dict[str, dict[str, dict]],
    runs: int,
    names: list[str],
    nice: int = 0,
    only: str = "",
) -> None:
    """Write this comparison's section of the results file (the others are kept). A run of
    some workloads only (`--only`) has its own section: it never replaces the full table."""
    base_name = BASELINE[which]
    section = f"{which}-nice{nice}" if nice else which
    if only:
        section += "-only-" + "-".join("".join(c if c.isalnum() else " " for c in only.lower()).split())
    flags = f" --services-nice {nice}" if nice else ""
    flags += f' --only "{only}"' if only else ""
    lines = [
        f"## {TITLE[which]}" + (f" (tokenspool's Redis and API at nice {nice})" if nice else ""),
        "",
        f"Command: `.venv/bin/python bench/peers.py --set {which} --runs {runs}{flags}` (after "
        f"`scripts/setup_peers`), {time.strftime('%Y-%m-%d')}.",
        f"Machine: {machine()}; llama.cpp threads 1 "
        "(one-token steps) / 2 (prefill, batched steps) for every server, SmolLM2-135M-Instruct "
        "Q4_1, greedy, 128 output tokens, context 4096 per sequence.",
        f"Each figure is the median of {runs} alternated runs (one run for a crash); TTFT and ITL "
        "in ms as p50 / p99; tok/s per stream (median) and aggregate; RSS is the peak of all of a "
        "server's processes (tokenspool: Redis + API + workers). Every request starts with a "
        "unique tag, so no server answers a whole prompt from its cache.",
        "",
    ]
    if which == "batching":
        ratio_head, ratio_of = f"{base_name} / this: tok/s total", "tok_s_total"
    else:
        ratio_head, ratio_of = f"{base_name} / this: TTFT, tok/s per stream", "tok_s_stream"
    head = "| server | completed | TTFT ms | ITL ms | tok/s per stream | tok/s total | peak RSS MB |"
    head += f" {ratio_head} |"
    for label, row in table.items():
        lines += [f"### {label}", "", head, "|---|---|---|---|---|---|---|---|"]
        base = row.get(base_name)
        for name in names:
            r = row[name]
            ratio = ""
            if base and name != base_name and r[ratio_of]:
                ratio = f"{base[ratio_of] / r[ratio_of]:.2f}"
                if which == "peers" and r["ttft_p50"] == r["ttft_p50"]:
                    ratio = f"{base['ttft_p50'] / r['ttft_p50']:.2f}, {ratio}"
            lines.append("| " + " | ".join([name, *cells(r), ratio]) + " |")
        lines.append("")
    if nice:
        lines[3:3] = [
            f"Here tokenspool's Redis and API run at nice {nice}, as they would on other cores or "
            "machines: on these two shared cores they otherwise compete with llama.cpp's threads, "
            "which wait for each other at every barrier of a step."
        ]
    write_section(path, section, lines)
    results = [
        {"server": name, **table[label][name], "of": table[label][name]["streams"], "streams": n}
        for label, n in _levels(which)
        if label in table
        for name in names
    ]
    entry = {
        "title": TITLE[which],
        "command": f"bench/peers.py --set {which} --runs {runs}{flags}",
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "results": results,
    }
    charts.record(path.with_suffix(".json"), section, entry)
    png = path.with_name(f"{path.stem}-{section}.png")
    charts.draw({section: entry}, png)
    print(f"wrote {path}, {path.with_suffix('.json')} and {png}")


def write_section(path: Path, section: str, lines: list[str]) -> None:
    """Replace one comparison's section of the results file, keeping the others."""
    block = f"<!-- {section} -->\n" + "\n".join(lines) + f"\n<!-- /{section} -->\n"
    text = path.read_text() if path.exists() else "# tokenspool next to the servers users run instead\n\n"
    begin, end = f"<!-- {section} -->", f"<!-- /{section} -->\n"
    if begin in text and end in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.write_text(text)


def _levels(which: str) -> list[tuple[str, int]]:
    if which == "batching":
        return [(f"{n} stream{'s' if n > 1 else ''}", n) for n in (1, 4, 8, 16)]
    return [("1 stream, short prompt", 1), ("8 streams", 8), ("32 streams", 32)]


def machine() -> str:
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in ln
        ),
        platform.processor(),
    )
    return f"{os.cpu_count()} vCPUs ({cpu}), {_mem_gb():.0f} GiB, no GPU"


def _mem_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 1024 / 1024
    return 0.0
