#!/bin/bash
O=/tmp/ab-press3
for run in c0-1 fix-1 p20-1 p20-2 fix-2 c0-2; do
  v=${run%-*}
  unset MAQUIS_EXP_NOPRESS MAQUIS_EXP_SPREAD_RTT_US
  B=/tmp/bin-press2
  case $v in c0) B=/tmp/bin-c90de31;; fix) export MAQUIS_EXP_NOPRESS=1;; p20) export MAQUIS_EXP_SPREAD_RTT_US=20000;; esac
  $B/maquis-bench micro --modes rtt,stream --rtt 20 --sizes 524288,8388608 --actors 16,128 --stream-actors 1,16 --configs affinity,raw-tcp --cell-seconds 10 --no-sweep --out $O/$run > $O/$run.log 2>&1
done
echo done > $O/DONE
