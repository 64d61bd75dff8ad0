"""Plot for `maquis-bench clients`: reads results.json in the given directory, writes
clients_memory.png there and prints its file name.

Usage: plot_clients.py DIR
"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

out = Path(sys.argv[1])
o = json.loads((out / "results.json").read_text())
mib = 1.0 / 1024
joins = [s for s in o["samples"] if not s["load"]]
load = [s for s in o["samples"] if s["load"]]

fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
a.plot([s["clients"] for s in joins], [s["server"]["rss_kib"] * mib for s in joins], "o-")
a.set_xlabel("clients joined")
a.set_ylabel("server RSS (MiB)")
a.set_title("server memory while clients join")
a.grid(alpha=0.3)

t0 = load[0]["t_s"] - 1.0 if load else 0.0
t = [s["t_s"] - t0 for s in load]
b.plot(t, [s["server"]["rss_kib"] * mib for s in load], "o-", label="server RSS")
b.plot(t, [s["tcp_kernel_kib"] * mib for s in load], "s--", label="kernel TCP buffers (machine)")
b.plot(t, [s["server"]["queued_bytes"] / (1 << 20) for s in load], "^:", label="server queued")
b.set_xlabel("seconds of load")
b.set_ylabel("MiB")
b.set_title(f"{o['args']['clients']} clients pushing faster than the server merges")
b.grid(alpha=0.3)
b.legend(fontsize=8)
fig.tight_layout()
fig.savefig(out / "clients_memory.png", dpi=110)
print("clients_memory.png")
