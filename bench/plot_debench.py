"""Plots for `maquis-bench debench`, in the style of DE-Bench's figures: reads results.json in
the given directory, writes debench_throughput.png (Fig. 5, 7, 8, 11: commands per CPU-second
against cluster size, one panel per series) and debench_latency.png (Fig. 6, 10, 12: each
command's p99 latency against cluster size) there, and prints their file names.

Usage: plot_debench.py DIR
"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

out = Path(sys.argv[1])
cells = json.loads((out / "results.json").read_text())


def system(c):
    return "erlang" if c["system"] == "erlang" else "maquis-" + c["overlay"]


STYLE = {"maquis-full-mesh": "-", "maquis-peer-to-peer": "--", "erlang": ":"}

# Each series: the parameter that varies, the others fixed as in the paper.
SERIES = [
    ("global commands (Fig. 5)", "global_pct", "%",
     lambda c: c["arg_bytes"] == 10 and c["compute_us"] == 10 and c["server_pct"] == 0),
    ("argument size (Fig. 7)", "arg_bytes", " B",
     lambda c: c["global_pct"] == 0 and c["compute_us"] == 10 and c["server_pct"] == 0),
    ("computation (Fig. 8)", "compute_us", " µs",
     lambda c: c["global_pct"] == 0 and c["arg_bytes"] == 10 and c["server_pct"] == 0),
    ("server calls (Fig. 11)", "server_pct", "%",
     lambda c: c["global_pct"] == 0 and c["arg_bytes"] == 10 and c["compute_us"] == 1),
]

panels = [s for s in SERIES if len({c[s[1]] for c in cells if s[3](c)}) > 1]
if panels:
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, (title, key, unit, keep) in zip(axes[0], panels):
        sel = [c for c in cells if keep(c)]
        for sysname in sorted({system(c) for c in sel}):
            for v in sorted({c[key] for c in sel}):
                pts = sorted((c["nodes"], c["ops_per_cpu_s"]) for c in sel
                             if system(c) == sysname and c[key] == v)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], "o" + STYLE.get(sysname, "-"),
                            label=f"{sysname} {v:g}{unit}")
        ax.set_title(title)
        ax.set_xlabel("nodes")
        ax.set_ylabel("commands per CPU-second")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "debench_throughput.png", dpi=110)
    print("debench_throughput.png")

# Latency: the workload with global commands if there is one, else the first.
glob = [c for c in cells if c["global_pct"] > 0]
pick = max(glob, key=lambda c: c["global_pct"]) if glob else (cells[0] if cells else None)
if pick:
    wl = ("global_pct", "arg_bytes", "compute_us", "server_pct")
    sel = [c for c in cells if all(c[k] == pick[k] for k in wl)]
    kinds = sorted({k for c in sel for k, v in c["commands"].items() if v["count"] > 0})
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for sysname in sorted({system(c) for c in sel}):
        for k in kinds:
            pts = sorted((c["nodes"], c["commands"][k]["p99_us"] / 1000.0) for c in sel
                         if system(c) == sysname and c["commands"].get(k, {}).get("count", 0) > 0)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o" + STYLE.get(sysname, "-"),
                        label=f"{sysname} {k}")
    ax.set_yscale("log")
    ax.set_xlabel("nodes")
    ax.set_ylabel("p99 latency (ms)")
    ax.set_title(f"latency of each command (Fig. 6): global {pick['global_pct']:g}%, "
                 f"{pick['arg_bytes']} B, {pick['compute_us']} µs")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "debench_latency.png", dpi=110)
    print("debench_latency.png")
