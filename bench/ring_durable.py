#!/usr/bin/env python3
"""What the ring store's durable backend costs: redis-benchmark against three `ring serve`
nodes on loopback, in memory and with `--data-dir` (redb, an fsync per group commit), in the
same invocation, alternating, several times.

    cargo build --release -p maquis-ring
    python3 bench/ring_durable.py [--reps 3] [--requests 50000] [--out bench/results/ring-durable]

Needs redis-benchmark and redis-cli (Debian's redis-tools: installed with apt-get when
missing). Writes results.json and report.md into --out.
"""

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RING = os.path.join(ROOT, "target", "release", "ring")
BASE_LISTEN, BASE_RESP = 7300, 6600


def need_tools():
    if shutil.which("redis-benchmark") and shutil.which("redis-cli"):
        return
    subprocess.run(["apt-get", "update"], check=True)
    subprocess.run(["apt-get", "install", "-y", "redis-tools"], check=True)


def info_ring(port):
    out = subprocess.run(
        ["redis-cli", "-p", str(port), "INFO", "ring"],
        capture_output=True, text=True, timeout=10,
    ).stdout
    return dict(l.strip().split(":", 1) for l in out.splitlines() if ":" in l)


def start_cluster(storage, data):
    procs = []
    for i in range(3):
        cmd = [RING, "serve", "--name", f"d{i + 1}",
               "--listen", f"127.0.0.1:{BASE_LISTEN + i}",
               "--resp", f"127.0.0.1:{BASE_RESP + i}"]
        if i > 0:
            cmd += ["--join", f"127.0.0.1:{BASE_LISTEN}"]
        if storage == "redb":
            cmd += ["--data-dir", os.path.join(data, f"d{i + 1}")]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = p.stdout.readline()
        if "listening" not in line:
            raise RuntimeError(f"node {i + 1} did not start: {line!r}")
        procs.append(p)
    deadline = time.time() + 60
    while True:
        infos = []
        for i in range(3):
            try:
                infos.append(info_ring(BASE_RESP + i))
            except Exception:
                infos.append({})
        if all(i.get("ring_nodes") == "d1,d2,d3" and i.get("ring_pending_transfers") == "0"
               and i.get("ring_recovering_vnodes") == "0" for i in infos):
            return procs
        if time.time() > deadline:
            raise RuntimeError(f"no convergence: {infos}")
        time.sleep(0.2)


def stop_cluster(procs):
    for p in procs:
        p.send_signal(signal.SIGKILL)
    for p in procs:
        p.wait()


def bench(port, clients, requests):
    out = subprocess.run(
        ["redis-benchmark", "-p", str(port), "-t", "set,get", "-n", str(requests),
         "-c", str(clients), "-r", "100000", "-q"],
        capture_output=True, text=True, timeout=900,
    ).stdout.replace("\r", "\n")
    res = {}
    for test in ("SET", "GET"):
        m = re.findall(rf"^{test}: ([0-9.]+) requests per second(?:, p50=([0-9.]+) msec)?", out, re.M)
        if m:
            rps, p50 = m[-1]
            res[test] = {"rps": float(rps), "p50_ms": float(p50) if p50 else None}
    return res


def machine():
    mem = open("/proc/meminfo").readline().split()[1]
    sysctl = lambda k: open("/proc/sys/" + k.replace(".", "/")).read().strip()
    fs = subprocess.run(["df", "-T", tempfile.gettempdir()], capture_output=True, text=True).stdout.splitlines()[-1].split()[1]
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(int(mem) / 1024 / 1024, 1),
        "kernel": platform.release(),
        "tcp_congestion_control": sysctl("net.ipv4.tcp_congestion_control"),
        "data_filesystem": f"{tempfile.gettempdir()} ({fs})",
        "commit": commit,
        "loadavg_at_start": open("/proc/loadavg").read().split()[:3],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--requests", type=int, default=50000)
    ap.add_argument("--clients", default="50,200")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "ring-durable"))
    a = ap.parse_args()
    if not os.path.exists(RING):
        sys.exit(f"{RING} missing: cargo build --release -p maquis-ring")
    need_tools()
    clients = [int(c) for c in a.clients.split(",")]
    m = machine()
    runs = []
    for rep in range(a.reps):
        for storage in ("memory", "redb"):
            data = tempfile.mkdtemp(prefix="ring-durable-")
            procs = start_cluster(storage, data)
            try:
                for c in clients:
                    before = info_ring(BASE_RESP)
                    r = bench(BASE_RESP, c, a.requests)
                    after = info_ring(BASE_RESP)
                    commits = int(after.get("storage_commits", 0)) - int(before.get("storage_commits", 0))
                    objects = int(after.get("storage_objects_written", 0)) - int(before.get("storage_objects_written", 0))
                    ms = int(after.get("storage_commit_ms", 0)) - int(before.get("storage_commit_ms", 0))
                    run = {"rep": rep, "storage": storage, "clients": c, "result": r,
                           "node1_commits": commits, "node1_objects": objects, "node1_commit_ms": ms}
                    runs.append(run)
                    print(json.dumps(run), flush=True)
            finally:
                stop_cluster(procs)
                shutil.rmtree(data, ignore_errors=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"machine": m, "requests": a.requests, "runs": runs}, f, indent=1)
    lines = [
        "# The durable backend's cost: redis-benchmark, memory against redb",
        "",
        f"Command: `python3 bench/ring_durable.py --reps {a.reps} --requests {a.requests} --clients {a.clients}`  ",
        f"Machine: {m['cores']} cores, {m['memory_gib']} GiB, Linux {m['kernel']}, TCP congestion control "
        f"{m['tcp_congestion_control']}; data directories on {m['data_filesystem']}; load average at start "
        f"{' '.join(m['loadavg_at_start'])}; commit {m['commit']}.  ",
        "Three `ring serve` nodes on 127.0.0.1 (64 partitions, N=3, R=W=2), one `redis-benchmark -t set,get "
        f"-n {a.requests} -r 100000 -c C -q` against the first node's Redis front; memory and redb runs "
        "alternate, each on a fresh cluster. The median of the repetitions is shown.",
        "",
        "| clients | test | memory req/s | redb req/s | redb / memory | memory p50 ms | redb p50 ms | node 1: objects per commit | node 1: ms per commit |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in clients:
        for test in ("SET", "GET"):
            def med(storage, key):
                v = [r["result"][test][key] for r in runs
                     if r["storage"] == storage and r["clients"] == c and test in r["result"]
                     and r["result"][test][key] is not None]
                return statistics.median(v) if v else None
            mem, red = med("memory", "rps"), med("redb", "rps")
            mp, rp = med("memory", "p50_ms"), med("redb", "p50_ms")
            rr = [r for r in runs if r["storage"] == "redb" and r["clients"] == c]
            opc = statistics.median([r["node1_objects"] / max(1, r["node1_commits"]) for r in rr]) if rr else 0
            mpc = statistics.median([r["node1_commit_ms"] / max(1, r["node1_commits"]) for r in rr]) if rr else 0
            ratio = f"{red / mem:.2f}" if mem and red else "–"
            fmt = lambda x, d=0: "–" if x is None else f"{x:.{d}f}"
            extra = (f"{opc:.1f}", f"{mpc:.2f}") if test == "SET" else ("", "")
            lines.append(f"| {c} | {test} | {fmt(mem)} | {fmt(red)} | {ratio} | {fmt(mp, 3)} | {fmt(rp, 3)} | {extra[0]} | {extra[1]} |")
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
