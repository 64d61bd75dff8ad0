"""Sets the runs of bench/results/micro-unsent-sweep side by side: per (RTT, configuration,
cell, transport.unsent_bytes), each run's p99, p99 with / alone (mixed cells), ops/s (mixed:
the transfers') and CPU µs per round trip."""
import json,glob,collections
rows=collections.defaultdict(list)
for d in sorted(glob.glob('bench/results/micro-unsent-sweep/u*-r*')):
    if not d.endswith(tuple('0123456789')): continue
    try: cells=json.load(open(d+'/results.json'))
    except Exception: continue
    u=d.split('/u')[1].split('-r')[0]
    for c in cells:
        if c['series']=='mixed':
            k=(c['rtt_ms'],c['config'],'mixed B=%d'%c['mixed']['bulk_actors'])
            rows[k+(u,)].append((c['p99_us']/1e3, c['p99_us']/max(1,c['mixed']['alone_p99_us']), c['mixed']['bulk_ops_per_s'], c['cpu_us_per_msg']))
        else:
            k=(c['rtt_ms'],c['config'],'rtt %dB'%c['payload_bytes'])
            rows[k+(u,)].append((c['p99_us']/1e3, 0, c['ops_per_s'], c['cpu_us_per_msg']))
for k in sorted(rows):
    v=rows[k]
    print(k, ' | '.join('p99 %.1f ms r %.2f ops %.1f cpu %.0f'%x for x in v))
