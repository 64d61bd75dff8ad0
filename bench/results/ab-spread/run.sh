#!/bin/bash
cd /work/main
O=/tmp/ab-spread
for round in 1 2; do
  for v in base spread; do
    case $v in base) B=/tmp/bin-1039c29;; spread) B=/tmp/bin-spread;; esac
    $B/maquis-bench echo --rtt 1 --sizes 524288,8388608 --actors 16,64 --out $O/echo-$v-$round > $O/echo-$v-$round.log 2>&1
    $B/maquis-bench micro --modes rtt,stream --rtt 20 --sizes 524288,8388608 --actors 16,128 --stream-actors 1,16 --configs affinity,raw-tcp --cell-seconds 5 --no-sweep --out $O/m20-$v-$round > $O/m20-$v-$round.log 2>&1
  done
done
echo done > $O/DONE
