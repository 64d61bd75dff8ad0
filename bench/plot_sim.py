"""Plot for the simulator sweeps of `bench/sim.sh`: reads the massive-failure JSON documents in
the given directory and writes sim_massive_failure.png there (delivery, RMR and routed delivery
against the fraction of nodes failed), then prints its file name.

Usage: plot_sim.py DIR
"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

out = Path(sys.argv[1])
series = [
    ("p2p-1000-massive-failure.json", "peer-to-peer, 1,000, heartbeats on"),
    ("before-0419fc8-p2p-1000-massive-failure.json", "earlier simulator, 1,000"),
    ("p2p-10000-massive-failure-no-heartbeats.json", "peer-to-peer, 10,000, heartbeats off"),
    ("cs-1000-massive-failure.json", "client-server, 1,000"),
    ("fm-100-massive-failure.json", "full mesh, 100"),
]


def failed(run):
    return 100.0 * (1.0 - run["live"] / run["nodes"])


fig, axes = plt.subplots(1, 3, figsize=(15, 4))
metrics = [
    ("delivery_mean_100", "mean delivery (100 broadcasts)"),
    ("rmr", "RMR"),
    ("routed_delivery", "routed delivery"),
]
for name, label in series:
    path = out / name
    if not path.exists():
        continue
    runs = json.loads(path.read_text())["runs"]
    for ax, (key, _) in zip(axes, metrics):
        pts = [(failed(r), r[key]) for r in runs if r.get(key) is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
for ax, (_, title) in zip(axes, metrics):
    ax.set_xlabel("nodes failed at once (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
axes[0].legend(fontsize=8, loc="lower left")
fig.tight_layout()
png = out / "sim_massive_failure.png"
fig.savefig(png, dpi=110)
print(png.name)
