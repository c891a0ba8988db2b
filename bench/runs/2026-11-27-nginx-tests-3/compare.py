import os, re, sys, collections
A, B = sys.argv[1], sys.argv[2]   # nginx taps, shard taps
rx = re.compile(r'^(not ok|ok) (\d+)(?: - (.*?))?(\s+# (TODO|SKIP).*)?$')
def load(d, f, todo_counts=False):
    res = {}
    p = os.path.join(d, f)
    if not os.path.exists(p): return None
    for line in open(p, errors='replace'):
        m = rx.match(line.rstrip('\n'))
        if not m: continue
        # A TODO check nginx's run marks is not one it claims; in shard's run a TODO comes
        # from a version test (`has_version`, which shard never passes): its result counts.
        if m.group(5) and not (todo_counts and m.group(5) == 'TODO'): continue
        res[(int(m.group(2)), (m.group(3) or '').strip())] = (m.group(1) == 'ok')
    return res
files = sorted(f for f in os.listdir(A) if f.endswith('.tap'))
tot_n = tot_s = 0
per = []
for f in files:
    n = load(A, f); s = load(B, f, True)
    if s is None: continue
    passed = [k for k, v in n.items() if v]
    if not passed: continue
    got = sum(1 for k in passed if s.get(k))
    tot_n += len(passed); tot_s += got
    per.append((len(passed) - got, f, got, len(passed)))
print(f"checks nginx passes: {tot_n}; shard passes {tot_s} of them ({100*tot_s/max(tot_n,1):.1f}%)")
full = sum(1 for x in per if x[0] == 0)
print(f"files (with a check nginx passes): {len(per)}; shard passes every such check in {full}")
for miss, f, got, n in sorted(per, reverse=True)[:int(sys.argv[3]) if len(sys.argv) > 3 else 40]:
    if miss: print(f"{miss:4d} missed  {got}/{n}  {f[:-4]}")
