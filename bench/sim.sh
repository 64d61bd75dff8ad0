#!/usr/bin/env bash
# Runs the committed simulator sweeps and writes their JSON under bench/results/sim/.
# Usage: bench/sim.sh [OUT_DIR]   (release build of the `maquis` binary first)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-bench/results/sim}"
mkdir -p "$out"
cargo build --release -p maquis-cli
sim=target/release/maquis
run() {
  local name="$1"; shift
  echo "== $name: maquis sim $*" >&2
  "$sim" sim "$@" --json > "$out/$name.json"
}
# The peer-to-peer overlay as nodes run it: member heartbeats from every node, routed sends.
run p2p-1000-massive-failure --nodes 1000 --scenario massive-failure --fail 0.2,0.4,0.6,0.8,0.9
# The same at 10,000 nodes with member heartbeats too rare to matter (one per node per
# 100,000 s) and no routing phase: broadcast alone, as the earlier simulator measured it.
run p2p-10000-massive-failure-no-heartbeats --nodes 10000 --scenario massive-failure \
  --fail 0.2,0.4,0.6,0.8,0.9 --member-heartbeat-ms 100000000 --routed 0
run p2p-1000-churn --nodes 1000 --scenario churn
run p2p-1000-partition --nodes 1000 --scenario partition
run cs-1000-massive-failure --nodes 1000 --overlay client-server --servers 4 \
  --servers-per-client 2 --scenario massive-failure --fail 0.2,0.5
run fm-100-massive-failure --nodes 100 --overlay full-mesh --scenario massive-failure --fail 0.2,0.5

python3 bench/plot_sim.py "$out"
