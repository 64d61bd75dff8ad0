import json,glob,sys
for d in sorted(glob.glob(sys.argv[1]+'/*/results.json')):
    cells=json.load(open(d)); cells=cells['cells'] if 'cells' in cells else cells
    raw={(c['series'],c['payload_bytes'],c['actors']):c for c in cells if c['config']=='raw-tcp'}
    out=[]
    for c in cells:
        if c['config']!='affinity': continue
        k=(c['series'],c['payload_bytes'],c['actors']); r=raw.get(k)
        if not r: continue
        s="%s%d×%d %.0f(%.2f)"%(k[0][0],k[1]//1024,k[2],c['ops_per_s'],c['ops_per_s']/r['ops_per_s'])
        if k[0]=='grid' and k[1]==524288: s+=" cpu%.2f p50 %.1f p99 %.1f"%(c['cpu_us_per_msg']/r['cpu_us_per_msg'],c['p50_us']/1000,c['p99_us']/1000)
        s+=" sp%.1f"%((c.get('lanes') or {}).get('striped_mean',0))
        out.append(s)
    print(d.split('/')[-2].ljust(9),' | '.join(out))
