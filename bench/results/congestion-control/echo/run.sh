#!/bin/bash
B=/tmp/bin-dc4ebda/maquis-bench
for r in 1 2; do
  for cc in cubic bbr; do
    sysctl -qw net.ipv4.tcp_congestion_control=$cc
    $B echo --rtt 1 --sizes 524288,8388608 --actors 16,64 --out /tmp/cc-echo/$cc-$r > /dev/null 2>&1
  done
done
sysctl -qw net.ipv4.tcp_congestion_control=bbr
