import json, time, sys
import numpy as np, cupy as cp
from runner.backends.cuda.slot_directory import DeviceSlotDirectory
out = {}
for policy in ("lru", "lfu"):
    d = DeviceSlotDirectory(512, 150, policy)
    rng = np.random.default_rng(0)
    ids = [cp.asarray(rng.choice(512, size=10, replace=False).astype(np.int32)[None]) for _ in range(2000)]
    for x in ids[:200]: d.serve(x)
    cp.cuda.Device().synchronize()
    s, e = cp.cuda.Event(), cp.cuda.Event()
    s.record()
    for x in ids[200:]: d.serve(x)
    e.record(); e.synchronize()
    out[policy] = {"us_per_serve_incl_launch": cp.cuda.get_elapsed_time(s, e) * 1000 / 1800,
                   "hit_rate": float(d.scalars.get()[2] / max(1, d.scalars.get()[2] + d.scalars.get()[3]))}
print(json.dumps(out))
