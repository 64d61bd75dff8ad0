"""Prints, per run directory given, each affinity cell: ops/s (÷ raw TCP in the same run when
there is one), p50/p99 in ms, CPU ÷ raw TCP's, and the mean spread of striped pieces."""
import json, sys

for d in sys.argv[1:]:
    cells = json.load(open(f"{d}/results.json"))
    cells = cells["cells"] if "cells" in cells else cells
    raw = {(c["series"], c["payload_bytes"], c["actors"]): c for c in cells if c["config"] == "raw-tcp"}
    print(d)
    for c in cells:
        if c["config"] != "affinity":
            continue
        k = (c["series"], c["payload_bytes"], c["actors"])
        r = raw.get(k)
        s = "  %s %5d KiB x %3d  %7.1f ops/s" % (k[0], k[1] // 1024, k[2], c["ops_per_s"])
        if r:
            s += " (%.2f x raw)  cpu %.2f x raw" % (c["ops_per_s"] / r["ops_per_s"], c["cpu_us_per_msg"] / r["cpu_us_per_msg"])
        if k[0] == "grid":
            s += "  p50 %.0f p99 %.0f ms" % (c["p50_us"] / 1e3, c["p99_us"] / 1e3)
        s += "  spread %.1f" % ((c.get("lanes") or {}).get("striped_mean", 0))
        print(s)
