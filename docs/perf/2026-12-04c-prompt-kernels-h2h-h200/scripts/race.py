"""Does a device sync after each prompt attention make the failing case pass (a race), or not?"""
import sys, os
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
from pathlib import Path
import numpy as np, cupy as cp
from runner.synth import synthesize
from runner.backends.numpy.ops import NumpyOps
from runner.backends.cuda.ops import CudaOps
from runner.backends.cuda import attention as attn
from test_ops_cuda import build, teacher_forced, prompt_ids

mode = sys.argv[1]
path = Path("/tmp/dbg-glm4moe-F32.gguf")
if not path.exists():
    synthesize(path, "glm4moe", "tiny", "F32", 0)
orig = attn.attention
def wrapped(*a, **kw):
    got = orig(*a, **kw)
    if mode == "sync":
        cp.cuda.Device().synchronize()
    if mode == "copy":  # same as the f16 result but computed into a fresh buffer then copied
        got = got.copy()
    return got
attn.attention = wrapped
ref = build(path, NumpyOps(kv_type="f32"))
tokens = prompt_ids(ref.cfg.n_vocab, 70, seed=2)
want = teacher_forced(ref, tokens, ubatch=33)
gpu = build(path, CudaOps(prefill_precision="f16", kv_type="f32"))
got = teacher_forced(gpu, tokens, ubatch=33)
err = np.abs(got - want).max(axis=1)
print(mode, "max", err.max(), "bad", np.nonzero(err > 2e-2 * np.std(want))[0].tolist(), flush=True)
