#!/bin/bash
name=$1; e=$2
mkdir -p /tmp/trace-echo
env $e /tmp/bin-exp/maquis-bench echo --rtt 1 --sizes 524288 --actors 16 --configs partisan --seconds 20 --out /tmp/trace-echo/$name > /tmp/trace-echo/$name.log 2>&1 &
B=$!
for i in $(seq 1 200); do pgrep -f "agent ring-node" >/dev/null && break; sleep 0.5; done
sleep 12
P=$(pgrep -f "agent ring-node" | tr '\n' ',' | sed 's/,$//')
timeout 20 perf trace -s -p $P -- sleep 5 > /tmp/trace-echo/$name.trace 2>&1
wait $B
