#!/bin/bash
# The ring KVS at 1 ms, 1 KiB, both configurations in one invocation, alternating two builds
# (OLD, NEW: directories holding `maquis-bench`), nothing else running.
#   OLD=/path NEW=/path ./run.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
for i in 1 2 3; do for b in OLD NEW; do
  "${!b}/maquis-bench" kvs --rtt 1 --sizes 1024 --actors 16,128 --configs single,partisan \
    --out "$here/kab-$b-$i" > /dev/null 2>&1
done; done
for i in 1 2 3 4; do for b in OLD NEW; do
  "${!b}/maquis-bench" kvs --rtt 1 --sizes 1024 --actors 16 --seconds 15 \
    --configs single,partisan --out "$here/kl-$b-$i" > /dev/null 2>&1
done; done
python3 "$here/summary.py" "$here"
