"""Per-slice ar/hybrid time ratios of ab.sh's runs. Usage: python summarize.py DIR"""
import sys
import json,glob,statistics as st
for arm in ['new','base']:
    rs=[]; dr=[]
    for f in sorted(glob.glob(sys.argv[1] + f'/ab_{arm}_*.jsonl')):
        rows=[json.loads(l) for l in open(f) if l.startswith('{"')]
        by={}
        for d in rows:
            if d['r']==0: continue
            by.setdefault((d['r'],d['s']),{})[d['cfg']]=d
        for k,v in by.items():
            if len(v)<2: continue
            rs.append(v['ar']['sec']/v['hybrid']['sec']); dr.append(sum(len(w) for w in v['hybrid']['drafted_at']))
    if rs: print(arm, len(rs), 'median', round(st.median(rs),3), 'mean', round(st.mean(rs),3), 'sum-ratio')
    print('   ', sorted(zip(dr,[round(r,2) for r in rs])))
