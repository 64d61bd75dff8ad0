#!/bin/bash
cd /tmp/w23
for pair in 1 2 3 4; do
  for v in win3 ads3; do
    /tmp/maquis-$v demo --sizes 524288 --bulk-size 0 > /tmp/w23/demo-$v-$pair.log 2>&1
    echo "demo $v $pair rc=$?" >> /tmp/w23/progress
  done
done
for pair in 1 2; do
  for v in win3 ads3; do
    /tmp/bin-$v micro --modes rtt --rtt 20 --sizes 524288 --actors 16,128 --configs affinity,raw-tcp --cell-seconds 6 --no-sweep --out /tmp/w23/rtt20-$v-$pair > /tmp/w23/rtt20-$v-$pair.log 2>&1
    echo "$v $pair rc=$?" >> /tmp/w23/progress
  done
done
for pair in 1 2; do
  for v in win3 ads3; do
    /tmp/maquis-$v demo > /tmp/w23/full-$v-$pair.log 2>&1
    echo "full $v $pair rc=$?" >> /tmp/w23/progress
  done
done
echo done >> /tmp/w23/progress
