"""Find the first prompt-attention call of the failing case whose tensor-core result departs from the f32 check path; dump it."""
import sys, os
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
from pathlib import Path
import numpy as np, cupy as cp
from runner.synth import synthesize
from runner.backends.numpy.ops import NumpyOps
from runner.backends.cuda.ops import CudaOps
from runner.backends.cuda import attention as attn
from test_ops_cuda import build, teacher_forced, prompt_ids

path = Path("/tmp/dbg-glm4moe-F32.gguf")
synthesize(path, "glm4moe", "tiny", "F32", 0)
orig = attn.attention
calls = [0]
dumped = [False]
def checked(q, k, v, n_kv, pos, out=None, **kw):
    got = orig(q, k, v, n_kv, pos, out, **kw)
    if q.shape[0] > 8 and not dumped[0]:
        ref = orig(q, k, v, n_kv, pos, None, **{**kw, "precision": "f32"})
        err = cp.abs(got - ref).max(axis=1)
        calls[0] += 1
        bad = cp.nonzero(err > 1e-2)[0]
        print(f"call {calls[0]} T={q.shape[0]} n_kv={n_kv} kdtype={k.dtype} max err {float(err.max()):.4g} bad rows {cp.asnumpy(bad).tolist()[:40]} "
              f"|q|max {float(cp.abs(q).max()):.4g} |k|max {float(cp.abs(k[:n_kv]).max()):.4g} |v|max {float(cp.abs(v[:n_kv]).max()):.4g}", flush=True)
        if len(bad):
            np.savez(os.environ["OUT"] + "/attn_fail.npz", q=cp.asnumpy(q), k=cp.asnumpy(k), v=cp.asnumpy(v), n_kv=n_kv,
                     pos=cp.asnumpy(pos), got=cp.asnumpy(got), ref=cp.asnumpy(ref))
            dumped[0] = True
    return got
attn.attention = checked
ref = build(path, NumpyOps(kv_type="f32"))
tokens = prompt_ids(ref.cfg.n_vocab, 70, seed=2)
gpu = build(path, CudaOps(prefill_precision="f16", kv_type="f32"))
teacher_forced(gpu, tokens, ubatch=33)
