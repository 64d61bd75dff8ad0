"""Prints partisan / single round trips a second per run and actor count, and the median
and range per build (the directory names say the build: kab-<commit>-<i>, kl-<commit>-<i>)."""
import json
import pathlib
import statistics
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
ratios = {}
for d in sorted(root.glob("k*-*-*/results.json")):
    j = json.loads(d.read_text())
    cells = j["cells"] if isinstance(j, dict) else j
    by = {(c["actors"], c["config"]): c for c in cells}
    row = []
    for a in sorted({c["actors"] for c in cells}):
        s, p = by[(a, "single")], by[(a, "partisan")]
        r = p["ops_per_s"] / s["ops_per_s"]
        ratios.setdefault(d.parent.name.split("-")[1], []).append(r)
        row.append(f'{a} actors: {s["ops_per_s"]:.0f} / {p["ops_per_s"]:.0f} = {r:.2f}x')
    print(f"{d.parent.name:16} " + "; ".join(row))
for build, rs in ratios.items():
    print(f"{build}: {len(rs)} cells, partisan / single median {statistics.median(rs):.2f}x, "
          f"range {min(rs):.2f}-{max(rs):.2f}x")
