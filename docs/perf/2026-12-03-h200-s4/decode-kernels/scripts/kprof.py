# One eager decode token of a resident model under ncu (profiling window = that token only).
import sys, numpy as np, cupy as cp
from runner.config import model_config
from runner.gguf_file import open_gguf
from runner.models import MoETransformer
from runner.ops_cuda import CudaOps
from runner.weights import load_weights
f = open_gguf(sys.argv[1]); cfg = model_config(f); w = load_weights(f, cfg)
ops = CudaOps(); ops.check_weights(w.all_tensors()); m = MoETransformer(cfg, w, ops)
kv = m.new_kv_cache(2048); rng = np.random.default_rng(0)
m.forward(rng.integers(0, cfg.n_vocab, size=1024), kv)
ops.graphs = False
tok = 5
for _ in range(3):
    logits, _ = ops.decode_forward(m, tok, kv); tok = int(np.argmax(ops.to_host(logits)[-1]))
cp.cuda.Device().synchronize()
cp.cuda.profiler.start()
logits, _ = ops.decode_forward(m, tok, kv); ops.to_host(logits)
cp.cuda.Device().synchronize()
cp.cuda.profiler.stop()
print("n_layer", cfg.n_layer, file=sys.stderr)
