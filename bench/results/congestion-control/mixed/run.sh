#!/bin/bash
# alternate bbr / cubic as the default congestion control that new namespaces copy
B=/tmp/bin-dc4ebda/maquis-bench
mkdir -p /tmp/cc-ab
for r in 1 2 3 4 5 6; do
  for cc in bbr cubic; do
    sysctl -qw net.ipv4.tcp_congestion_control=$cc
    O=/tmp/cc-ab/$cc-$r
    $B micro --modes mixed --rtt 20 --sizes 1024 --configs affinity --cell-seconds 5 --no-sweep --out $O > $O.log 2>&1 &
    P=$!
    sleep 3
    while kill -0 $P 2>/dev/null; do
      ip netns exec mqbench-h1 ss -tin 2>/dev/null | grep -o "^ *[a-z]* .*cwnd:[0-9]*\|bbr:([^)]*)\|cwnd:[0-9]*" | tr '\n' ' ' | sed "s/^/$(date +%s.%N | cut -c1-14) /" >> $O.ss; echo >> $O.ss
      sleep 0.25
    done
  done
done
sysctl -qw net.ipv4.tcp_congestion_control=bbr
