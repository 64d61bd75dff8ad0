#!/bin/bash
# usage: prof-8m.sh name config
name=$1; cfg=$2
mkdir -p /tmp/prof-8m
/tmp/bin-d597858/maquis-bench echo --rtt 1 --sizes 8388608 --actors 16 --configs $cfg --seconds 25 --out /tmp/prof-8m/$name > /tmp/prof-8m/$name.log 2>&1 &
B=$!
for i in $(seq 1 200); do pgrep -f "agent ring-node" >/dev/null && break; sleep 0.5; done
sleep 14
P=$(pgrep -f "agent ring-node" | tr '\n' ',' | sed 's/,$//')
perf stat -e context-switches,task-clock,raw_syscalls:sys_enter -p $P -- sleep 8 2> /tmp/prof-8m/$name.stat
perf trace -s -p $P -- sleep 5 2> /tmp/prof-8m/$name.trace >/dev/null
wait $B
