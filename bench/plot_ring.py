"""Plots for `maquis-bench echo` and `maquis-bench kvs`: reads results.json in the given
directory, writes PNGs there and prints their file names, one per line.

Usage: plot_ring.py DIR WORKLOAD   (WORKLOAD: echo or kvs, used in titles and file names)
"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

out = Path(sys.argv[1])
workload = sys.argv[2] if len(sys.argv) > 2 else "ring"
cells = json.loads((out / "results.json").read_text())
order = ["single", "partisan"]
configs = [c for c in order if any(x["config"] == c for x in cells)]
colors = {"single": "tab:orange", "partisan": "tab:blue"}
title = {"echo": "echo service", "kvs": "key-value store"}.get(workload, workload)


def human(size):
    if size >= 1 << 20 and size % (1 << 20) == 0:
        return f"{size >> 20} MiB"
    if size >= 1024 and size % 1024 == 0:
        return f"{size >> 10} KiB"
    return f"{size} B"


def pick(rtt, size, cfg):
    sub = [c for c in cells if c["rtt_ms"] == rtt and c["payload_bytes"] == size and c["config"] == cfg]
    return sorted(sub, key=lambda c: c["actors"])


sizes = sorted({c["payload_bytes"] for c in cells})
rtts = sorted({c["rtt_ms"] for c in cells})
actors = sorted({c["actors"] for c in cells})


def valid(c):
    return not c.get("membership")


RATIO_TICKS = [0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100]


def axes_style(ax, log_y, values=()):
    ax.set_xscale("log", base=2)
    ax.set_xticks(actors, [str(n) for n in actors])
    ax.xaxis.set_minor_formatter(NullFormatter())
    if log_y:
        ax.set_yscale("log")
        lo, hi = min(values, default=1), max(values, default=1)
        ticks = [t for t in RATIO_TICKS if lo / 2 <= t <= hi * 2] or [1]
        ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_ylim(bottom=0)
    ax.set_xlabel("actors per node (3 nodes)")
    ax.grid(True, which="both", alpha=0.3)


def mark_invalid(ax, xs, ys, sub):
    bad = [(x, y) for x, y, c in zip(xs, ys, sub) if not valid(c)]
    if bad:
        ax.scatter([b[0] for b in bad], [b[1] for b in bad], s=160, facecolors="none",
                   edgecolors="red", linewidths=1.5, zorder=5)

# One figure per RTT: throughput (top) and latency (bottom) against actors, one column per payload.
for rtt in rtts:
    fig, axes = plt.subplots(2, len(sizes), figsize=(4.2 * len(sizes), 7), squeeze=False)
    for j, size in enumerate(sizes):
        top, bottom = axes[0][j], axes[1][j]
        for cfg in configs:
            sub = pick(rtt, size, cfg)
            if not sub:
                continue
            xs = [c["actors"] for c in sub]
            ops = [c["ops_per_s"] for c in sub]
            top.plot(xs, ops, marker="o", color=colors[cfg], label=cfg)
            mark_invalid(top, xs, ops, sub)
            bottom.plot(xs, [c["p50_us"] / 1e3 for c in sub], marker="o", color=colors[cfg],
                        label=f"{cfg} p50")
            bottom.plot(xs, [c["p99_us"] / 1e3 for c in sub], marker="x", linestyle="--",
                        color=colors[cfg], label=f"{cfg} p99")
        top.set_title(f"payload {human(size)}")
        axes_style(top, False)
        axes_style(bottom, False)
        top.set_ylabel("requests / s (all nodes)")
        bottom.set_ylabel("latency ms")
        top.legend(fontsize=8)
        bottom.legend(fontsize=7)
    note = "\nred ring: a node was declared down during the cell (not valid)" if any(
        not valid(c) for c in cells if c["rtt_ms"] == rtt) else ""
    fig.suptitle(f"Ring {title}, RTT {rtt} ms: single vs partisan{note}")
    fig.tight_layout()
    name = f"{workload}_rtt{rtt}ms.png"
    fig.savefig(out / name, dpi=90)
    plt.close(fig)
    print(name)

# The partisan/single throughput ratio for every RTT and payload.
if "single" in configs and "partisan" in configs:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ratios = []
    for rtt in rtts:
        for size in sizes:
            s = {c["actors"]: c["ops_per_s"] for c in pick(rtt, size, "single")}
            p = {c["actors"]: c["ops_per_s"] for c in pick(rtt, size, "partisan")}
            ok = {c["actors"] for c in pick(rtt, size, "single") + pick(rtt, size, "partisan")
                  if not valid(c)}
            xs = [n for n in sorted(s) if n in p and s[n] > 0 and n not in ok]
            if not xs:
                continue
            ratios += [p[n] / s[n] for n in xs]
            ax.plot(xs, [p[n] / s[n] for n in xs], marker="o",
                    linestyle="-" if rtt == rtts[0] else "--", label=f"{rtt} ms, {human(size)}")
    ax.axhline(1.0, color="black", linewidth=0.8)
    axes_style(ax, True, ratios + [1.0])
    ax.set_ylabel("partisan / single (ops/s; invalid cells left out)")
    ax.set_title(f"Ring {title}: throughput ratio")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    name = f"{workload}_ratio.png"
    fig.savefig(out / name, dpi=90)
    plt.close(fig)
    print(name)
