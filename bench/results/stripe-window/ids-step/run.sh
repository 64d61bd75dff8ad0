#!/bin/bash
cd /tmp/w21
for pair in 1 2 3; do
  for v in large win2; do
    /tmp/bin-$v micro --modes rtt --rtt 20 --sizes 524288 --actors 16,128 --configs affinity,raw-tcp --cell-seconds 8 --no-sweep --out /tmp/w21/rtt20-$v-$pair > /tmp/w21/rtt20-$v-$pair.log 2>&1
    echo "$v $pair rc=$?" >> /tmp/w21/progress
  done
done
for pair in 1 2; do
  for v in large win2; do
    /tmp/maquis-$v demo --sizes 524288 --bulk-size 0 > /tmp/w21/demo-$v-$pair.log 2>&1
    echo "demo $v $pair rc=$?" >> /tmp/w21/progress
  done
done
echo done >> /tmp/w21/progress
