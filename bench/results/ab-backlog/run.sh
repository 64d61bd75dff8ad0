#!/bin/bash
# A/B of the spread's backlog rule: base = c557a64, backlog = the change (binaries in /tmp/bin-*).
O=${O:-/tmp/ab-backlog}
for round in 1 2; do
  for v in base backlog; do
    case $v in base) B=/tmp/bin-c557a64;; backlog) B=/tmp/bin-bl2;; esac
    RUST_LOG=maquis::transport::widen=debug $B/maquis-bench micro --modes rtt --rtt 1 --sizes 524288 --actors 16,128 --configs affinity,raw-tcp --cell-seconds 10 --no-sweep --out $O/m1-$v-$round > $O/m1-$v-$round.log 2>&1
    $B/maquis-bench echo --rtt 1 --sizes 524288,8388608 --actors 16,64 --out $O/echo-$v-$round > $O/echo-$v-$round.log 2>&1
    RUST_LOG=maquis::transport::widen=debug $B/maquis-bench micro --modes rtt,stream --rtt 20 --sizes 524288,8388608 --actors 16,128 --stream-actors 1,16 --configs affinity,raw-tcp --cell-seconds 5 --no-sweep --out $O/m20-$v-$round > $O/m20-$v-$round.log 2>&1
  done
done
echo done > $O/DONE
