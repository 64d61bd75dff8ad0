#!/bin/bash
cd /tmp/w22
for pair in 1 2 3; do
  for v in large win3; do
    /tmp/bin-$v micro --modes rtt --rtt 20 --sizes 524288,8388608 --actors 16,128 --configs affinity,raw-tcp --cell-seconds 6 --no-sweep --out /tmp/w22/rtt20-$v-$pair > /tmp/w22/rtt20-$v-$pair.log 2>&1
    echo "$v $pair rc=$?" >> /tmp/w22/progress
  done
done
for pair in 1 2 3; do
  for v in large win3; do
    /tmp/maquis-$v demo --sizes 524288 --bulk-size 0 > /tmp/w22/demo-$v-$pair.log 2>&1
    echo "demo $v $pair rc=$?" >> /tmp/w22/progress
  done
done
echo done >> /tmp/w22/progress
