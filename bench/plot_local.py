"""Plot for `maquis-bench local`: reads results.json in the given directory and writes
local.png there (messages or calls per second per workload and system, the median run, and the
memory of an idle actor), then prints its file name.

Usage: plot_local.py DIR
"""
import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

out = Path(sys.argv[1])
cells = json.loads((out / "results.json").read_text())
systems = list(dict.fromkeys(c["system"] for c in cells))
flows = [w for w in ["one-to-one", "many-to-one", "calls"] if any(c["workload"] == w for c in cells)]
idle = [c for c in cells if c["workload"] == "idle"]


def med(system, workload, key):
    vals = [c[key] for c in cells if c["system"] == system and c["workload"] == workload]
    return statistics.median(vals) if vals else 0.0


panels = (1 if flows else 0) + (1 if idle else 0)
if panels:
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4), squeeze=False)
    ax_i = 0
    if flows:
        ax = axes[0][ax_i]
        ax_i += 1
        width = 0.8 / len(systems)
        for i, s in enumerate(systems):
            xs = [j + i * width for j in range(len(flows))]
            ax.bar(xs, [med(s, w, "msgs_per_s") / 1e6 for w in flows], width, label=s)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(flows))])
        ax.set_xticklabels(flows)
        ax.set_ylabel("million messages (calls) / s")
        ax.set_title("throughput (median run)")
        ax.legend()
    if idle:
        ax = axes[0][ax_i]
        present = [s for s in systems if any(c["system"] == s for c in idle)]
        ax.bar(present, [med(s, "idle", "bytes_per_actor") for s in present])
        ax.axhline(1024, linestyle=":", color="grey")
        ax.set_ylabel("bytes of resident memory per idle actor")
        ax.set_title("idle actors")
    fig.tight_layout()
    fig.savefig(out / "local.png", dpi=110)
    print("local.png")
