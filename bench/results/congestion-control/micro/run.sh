#!/bin/bash
B=/tmp/bin-dc4ebda/maquis-bench
for r in 1 2; do
  for cc in bbr cubic; do
    sysctl -qw net.ipv4.tcp_congestion_control=$cc
    $B micro --modes rtt,stream --rtt 20 --sizes 524288,8388608 --actors 16,128 --stream-actors 1,16 --configs affinity,raw-tcp --cell-seconds 5 --no-sweep --out /tmp/cc-micro/$cc-$r > /dev/null 2>&1
  done
done
sysctl -qw net.ipv4.tcp_congestion_control=bbr
