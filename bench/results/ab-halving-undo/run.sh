#!/bin/bash
# A/B of the spread's halving undo at 20 ms. BEFORE and AFTER: directories holding the
# maquis-bench binaries of 737bae8 and of the change (cargo build --release -p maquis-bench
# at each commit). Runs, one after the other: the 20 ms grid twice each, alternating; the two
# 128-actor closed loops three times each with the spread's changes logged; one traced run of
# the 128 x 512 KiB cell each.
set -e
: "${BEFORE:?directory of the binary before}" "${AFTER:?directory of the binary after}"
bin() { if [ "$1" = before ]; then echo "$BEFORE/maquis-bench"; else echo "$AFTER/maquis-bench"; fi; }
for i in 1 2; do for v in before after; do
  "$(bin $v)" micro --modes rtt,stream --rtt 20 --sizes 524288,8388608 --actors 16,128 \
    --stream-actors 1,16 --configs affinity,raw-tcp --cell-seconds 10 --no-sweep --out "$v-$i"
done; done
for i in 1 2 3; do for v in before after; do
  RUST_LOG=maquis::transport::widen=debug "$(bin $v)" micro --modes rtt --rtt 20 \
    --sizes 524288,8388608 --actors 128 --configs affinity --cell-seconds 10 --no-sweep \
    --out "focus/$v-$i"
done; done
for v in before after; do
  RUST_LOG=maquis::transport::widen=debug "$(bin $v)" micro --modes rtt --rtt 20 \
    --sizes 524288 --actors 128 --configs affinity --cell-seconds 10 --no-sweep --out "trace/$v"
done
"$BEFORE/maquis-bench" micro --quick --out quick-before
"$AFTER/maquis-bench" micro --quick --out quick-after
for i in 1 2 3; do for v in before after; do
  RUST_LOG=maquis::transport::widen=debug "$(bin $v)" micro --modes mixed --rtt 1 \
    --configs affinity --cell-seconds 5 --no-sweep --out "mixed-1ms/$v-$i"
done; done
