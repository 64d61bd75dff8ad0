#!/usr/bin/env python3
"""Failure detection between real processes: N `maquis node` processes on one overlay, one
killed with SIGKILL; per other node, the time until it printed the victim's `Down` event, then
a quiet period in which any other `Down` or `Left` is a false positive.

    cargo build --release -p maquis-cli
    python3 bench/failure_detection.py --nodes 8 --overlay peer-to-peer --rounds 5 --out DIR

The nodes take `MAQUIS_*` variables from the environment (for instance
`MAQUIS_BROADCAST_SUSPICION_MS=0` to measure without accusations). Writes DIR/results.json. Times are measured from the SIGKILL to the line's
arrival at this script (each node's stdout is a pipe read by its own thread).
"""
import argparse
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

BIN = os.path.join(os.path.dirname(__file__), "..", "target", "release", "maquis")


class Proc:
    def __init__(self, name, args):
        self.name = name
        self.p = subprocess.Popen(
            [BIN, "node", "--name", name, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0",
             "--cookie", "fd-bench"] + args,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self.lines = []  # (monotonic time, line)
        self.cv = threading.Condition()
        self.addr = None
        self.admin = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            now = time.monotonic()
            with self.cv:
                if self.addr is None:
                    m = re.search(r"listening on (\S+)", line)
                    if m:
                        self.addr = m.group(1)
                m = re.search(r"admin on (http://\S+)", line)
                if m:
                    self.admin = m.group(1)
                self.lines.append((now, line.strip()))
                self.cv.notify_all()

    def wait_for(self, pred, timeout):
        deadline = time.monotonic() + timeout
        with self.cv:
            while True:
                for t, l in self.lines:
                    if pred(l):
                        return t
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cv.wait(left)

    def kill(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
            self.p.wait()


def event_of(line):
    m = re.match(r'(Up|Down|Left)\(NodeId \{ name: "([^"]+)"', line)
    return (m.group(1), m.group(2)) if m else None


def members(proc):
    """The node's members, as its admin endpoint's /status lists them."""
    with urllib.request.urlopen(proc.admin + "/status", timeout=2) as r:
        status = json.load(r)
    return {m["name"] if isinstance(m, dict) else m for m in status["members"]}


def one_round(args, r):
    extra = ["--overlay", args.overlay]
    names = [f"r{r}n{i}" for i in range(args.nodes)]
    procs = []
    try:
        for i, n in enumerate(names):
            a = list(extra)
            if args.overlay == "client-server":
                a += ["--role", "server" if i < 2 else "client"]
            if i > 0:
                a += ["--join", procs[0].addr]
            p = Proc(n, a)
            if p.wait_for(lambda l: "admin on" in l, 10) is None:
                raise RuntimeError(f"{n} did not start")
            procs.append(p)
        deadline = time.monotonic() + 60
        for p in procs:
            while not set(names) <= members(p):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{p.name} does not see everyone: {members(p)}")
                time.sleep(0.2)
        victim = procs[args.victim]
        t0 = time.monotonic()
        victim.kill()
        times = {}
        for p in procs:
            if p is victim:
                continue
            t = p.wait_for(lambda l: event_of(l) == ("Down", victim.name), args.limit)
            times[p.name] = None if t is None else round((t - t0) * 1000, 1)
        time.sleep(args.quiet)  # the observation window for false positives
        false = []
        for p in procs:
            if p is victim:
                continue
            for t, l in p.lines:
                e = event_of(l)
                if e and e[0] in ("Down", "Left") and e[1] != victim.name:
                    false.append(f"{p.name}: {l}")
        return {"round": r, "detect_ms": times, "false_positives": false}
    finally:
        for p in procs:
            p.kill()


def machine():
    def sysctl(k):
        try:
            return open("/proc/sys/" + k.replace(".", "/")).read().strip()
        except OSError:
            return "?"
    mem = open("/proc/meminfo").readline().split()[1]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {
        "cores": os.cpu_count(), "mem_kib": int(mem), "kernel": platform.release(),
        "tcp_congestion_control": sysctl("net.ipv4.tcp_congestion_control"), "commit": commit,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--overlay", default="peer-to-peer")
    ap.add_argument("--victim", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--limit", type=float, default=15.0)
    ap.add_argument("--quiet", type=float, default=10.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rounds = [one_round(args, r) for r in range(args.rounds)]
    all_t = [t for r in rounds for t in r["detect_ms"].values() if t is not None]
    missed = sum(1 for r in rounds for t in r["detect_ms"].values() if t is None)
    false = sum(len(r["false_positives"]) for r in rounds)
    summary = {
        "overlay": args.overlay, "nodes": args.nodes, "rounds": args.rounds,
        "detect_ms_min": min(all_t) if all_t else None,
        "detect_ms_median": statistics.median(all_t) if all_t else None,
        "detect_ms_max": max(all_t) if all_t else None,
        "missed": missed, "false_positives": false,
        "machine": machine(), "command": " ".join(sys.argv),
        "env": {k: v for k, v in os.environ.items() if k.startswith("MAQUIS_")},
    }
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"summary": summary, "rounds": rounds}, f, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
