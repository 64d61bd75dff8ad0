"""Plots for `maquis-bench micro`: reads results.json in the given directory, writes PNGs there
and prints their file names, one per line."""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

out = Path(sys.argv[1])
cells = json.loads((out / "results.json").read_text())
grid = [c for c in cells if c["series"] == "grid"]
order = ["erlang", "single", "single-tls", "parallel", "parallel-tls", "affinity", "affinity-tls", "raw-tcp"]
configs = [c for c in order if any(x["config"] == c for x in grid)]


def human(size):
    if size >= 1 << 20:
        return f"{size >> 20} MiB"
    if size >= 1024:
        return f"{size >> 10} KiB"
    return f"{size} B"


for rtt in sorted({c["rtt_ms"] for c in grid}):
    for size in sorted({c["payload_bytes"] for c in grid}):
        sub = [c for c in grid if c["rtt_ms"] == rtt and c["payload_bytes"] == size]
        actors = sorted({c["actors"] for c in sub})
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
        width = 0.8 / max(1, len(configs))
        for i, cfg in enumerate(configs):
            xs, p50, p99, ops = [], [], [], []
            for j, n in enumerate(actors):
                m = [c for c in sub if c["actors"] == n and c["config"] == cfg]
                if m:
                    xs.append(j + i * width)
                    p50.append(m[0]["p50_us"] / 1e3)
                    p99.append(m[0]["p99_us"] / 1e3)
                    ops.append(m[0]["ops_per_s"])
            ax1.bar(xs, p50, width, label=cfg)
            ax1.scatter(xs, p99, marker="_", color="black", s=40)
            ax2.plot([actors[int(round(x - i * width))] for x in xs], ops, marker="o", label=cfg)
        ax1.set_xticks([j + 0.4 - width / 2 for j in range(len(actors))], [str(n) for n in actors])
        ax1.set_xlabel("concurrent actors")
        ax1.set_ylabel("latency ms (bar p50, tick p99)")
        ax1.set_yscale("log")
        ax2.set_xlabel("concurrent actors")
        ax2.set_ylabel("round trips / s")
        ax2.set_yscale("log")
        ax2.set_xscale("log", base=2)
        ax1.legend(fontsize=8)
        fig.suptitle(f"RTT {rtt} ms, payload {human(size)}")
        fig.tight_layout()
        name = f"micro_rtt{rtt}ms_{size}B.png"
        fig.savefig(out / name, dpi=90)
        plt.close(fig)
        print(name)

sweep = [c for c in cells if c["series"] == "sweep"]
if sweep:
    sweep.sort(key=lambda c: c["parallelism"])
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [c["parallelism"] for c in sweep]
    for key, label in [("p50_us", "p50"), ("p99_us", "p99"), ("max_us", "max")]:
        ax.plot(xs, [c[key] / 1e3 for c in sweep], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("connections per peer")
    ax.set_ylabel("latency ms")
    ax.set_title("affinity, 128 actors, 512 KiB, 1 ms RTT")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "micro_connections.png", dpi=90)
    plt.close(fig)
    print("micro_connections.png")

stream = [c for c in cells if c["series"] == "stream"]
if stream:
    keys = []
    for c in stream:
        k = (c["rtt_ms"], c["payload_bytes"], c["actors"])
        if k not in keys:
            keys.append(k)
    names = [c for c in order if any(x["config"] == c for x in stream)]
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(keys)), 4))
    width = 0.8 / max(1, len(names))
    for i, cfg in enumerate(names):
        xs, ys = [], []
        for j, (rtt, size, n) in enumerate(keys):
            m = [c for c in stream if (c["rtt_ms"], c["payload_bytes"], c["actors"]) == (rtt, size, n) and c["config"] == cfg]
            if m:
                xs.append(j + i * width)
                ys.append(m[0]["ops_per_s"])
        ax.bar(xs, ys, width, label=cfg)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))],
                  [f"{rtt} ms\n{human(size)}\n{n} actors" for rtt, size, n in keys])
    ax.set_ylabel("messages delivered / s")
    ax.set_yscale("log")
    ax.set_title("one-way stream")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "micro_stream.png", dpi=90)
    plt.close(fig)
    print("micro_stream.png")

mixed = [c for c in cells if c["series"] == "mixed" and c.get("mixed")]
if mixed:
    keys = []
    for c in mixed:
        k = (c["rtt_ms"], c["actors"], c["mixed"]["bulk_actors"])
        if k not in keys:
            keys.append(k)
    names = [c for c in order if any(x["config"] == c for x in mixed)]
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(keys)), 4))
    width = 0.8 / max(1, len(names))
    for i, cfg in enumerate(names):
        xs, alone, both = [], [], []
        for j, k in enumerate(keys):
            m = [c for c in mixed if (c["rtt_ms"], c["actors"], c["mixed"]["bulk_actors"]) == k and c["config"] == cfg]
            if m:
                xs.append(j + i * width)
                alone.append(m[0]["mixed"]["alone_p99_us"] / 1e3)
                both.append(m[0]["p99_us"] / 1e3)
        ax.bar(xs, both, width, label=cfg)
        ax.scatter(xs, alone, marker="_", color="black", s=60)
    bulk = human(mixed[0]["mixed"]["bulk_payload_bytes"])
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))],
                  [f"{rtt} ms\n{n} calls\n{b} × {bulk}" for rtt, n, b in keys])
    ax.set_ylabel("calls' p99 ms (bar: with transfers, tick: alone)")
    ax.set_yscale("log")
    ax.set_title(f"small calls beside bulk transfers of {bulk}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "micro_mixed.png", dpi=90)
    plt.close(fig)
    print("micro_mixed.png")
