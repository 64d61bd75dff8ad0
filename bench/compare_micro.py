#!/usr/bin/env python3
"""Pairs the cells of two `maquis-bench micro` runs and prints a Markdown table.

Usage: bench/compare_micro.py BEFORE/results.json AFTER/results.json > compare.md

A cell is (rtt, config, lanes, actors, payload, series); the table gives both throughputs,
their ratio and the CPU time per message of both runs, and ends with the range of the ratio
for the Maquis configurations and for each baseline (Distributed Erlang, raw TCP), which did
not change between the runs and so show how far the machine's noise alone moves a cell.
"""
import json
import sys

BASELINES = ("erlang", "raw-tcp")


def key(c):
    return (c["rtt_ms"], c["config"], c["parallelism"], c["actors"], c["payload_bytes"], c["series"])


def main(before_path, after_path):
    before = {key(c): c for c in json.load(open(before_path))}
    after = [c for c in json.load(open(after_path))]
    print("| rtt ms | config | lanes | actors | payload | before ops/s | after ops/s | after/before "
          "| CPU µs/msg before → after |")
    print("|---|---|---|---|---|---|---|---|---|")
    ratios = {}
    for c in after:
        b = before.get(key(c))
        if b is None or not b["ops_per_s"]:
            continue
        r = c["ops_per_s"] / b["ops_per_s"]
        group = c["config"] if c["config"] in BASELINES else "maquis"
        ratios.setdefault(group, []).append(r)
        print(f"| {c['rtt_ms']} | {c['config']} | {c['parallelism']} | {c['actors']} | "
              f"{c['payload_bytes']} | {b['ops_per_s']:.1f} | {c['ops_per_s']:.1f} | {r:.2f} | "
              f"{b['cpu_us_per_msg']:.1f} → {c['cpu_us_per_msg']:.1f} |")
    print()
    for group, rs in sorted(ratios.items()):
        print(f"- {group}: after/before {min(rs):.2f}–{max(rs):.2f} over {len(rs)} cells")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
