#!/bin/bash
# The spread's start at 20 ms with pieces that take the spread as it is (45d687c): one lane per 2 ms (committed, 11 lanes),
# per 5 ms (5 lanes), per 20 ms (2 lanes); trials as committed (MAQUIS_EXP_NOPRESS=1). Binary: 951a746 + 45d687c's change + experiment.patch.
O=/tmp/ab-floor
B=/tmp/bin-press2
export MAQUIS_EXP_NOPRESS=1
for run in f2000-1 f5000-1 f20000-1 f20000-2 f5000-2 f2000-2; do
  v=${run%-*}; export MAQUIS_EXP_SPREAD_RTT_US=${v#f}
  $B/maquis-bench micro --modes rtt,stream --rtt 20 --sizes 524288,8388608 --actors 16,128 --stream-actors 1,16 --configs affinity,raw-tcp --cell-seconds 10 --no-sweep --out $O/$run > $O/$run.log 2>&1
done
echo done > $O/DONE
