#!/bin/bash
B=/tmp/bin-lanes/maquis-bench
mkdir -p /tmp/ab-lanes
for r in 1 2; do
  for l in 16 2 4 8; do
    MAQUIS_EXP_LANES=$l $B echo --rtt 1 --sizes 524288 --actors 16,64 --out /tmp/ab-lanes/l$l-$r > /dev/null 2>&1
  done
done
