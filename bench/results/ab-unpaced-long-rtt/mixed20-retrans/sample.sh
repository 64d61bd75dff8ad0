#!/bin/bash
# usage: ret.sh BIN OUT ; samples retransmit counters in both namespaces every 0.5 s
B=$1; O=$2
$B micro --modes mixed --rtt 20 --sizes 1024 --configs affinity --cell-seconds 5 --no-sweep --out $O > $O.log 2>&1 &
P=$!
rm -f $O.ret
while kill -0 $P 2>/dev/null; do
  for ns in mqbench-h1 mqbench-h2; do
    v=$(ip netns exec $ns nstat -az TcpOutSegs TcpRetransSegs TcpExtTCPLossProbes TcpExtTCPLostRetransmit TcpExtTCPSackRecovery 2>/dev/null | awk 'NR>1{printf "%s=%s ", $1, $2}')
    [ -n "$v" ] && echo "$(date +%s.%N | cut -c1-14) $ns $v" >> $O.ret
  done
  sleep 0.5
done
grep -A8 -i "^## Mixed" $O/report.md | grep "^| 20 ms" | awk -F'|' '{printf "B=%s p99 %s→%s (%s) tr %s\n", $4,$8,$11,$12,$13}'
for ns in mqbench-h1 mqbench-h2; do grep " $ns " $O.ret | tail -1; done
