#!/bin/bash
B=/tmp/bin-lanes/maquis-bench
mkdir -p /tmp/ab-fill
for r in 1 2; do
  for v in base fill; do
    if [ $v = fill ]; then E="MAQUIS_EXP_FILL=1"; else E="X=1"; fi
    env $E $B echo --rtt 1 --sizes 524288,8388608 --actors 16,64 --out /tmp/ab-fill/echo-$v-$r > /dev/null 2>&1
    env $E $B micro --modes rtt,stream --rtt 20 --sizes 524288,8388608 --actors 16,128 --stream-actors 1,16 --configs affinity,raw-tcp --cell-seconds 5 --no-sweep --out /tmp/ab-fill/m20-$v-$r > /dev/null 2>&1
  done
done
