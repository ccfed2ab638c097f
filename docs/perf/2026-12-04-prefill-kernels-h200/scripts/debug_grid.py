"""test_prefill_batches_match_numpy[f16] on the grid-type mix: which prompt kernel loses the precision."""
import sys
from pathlib import Path
sys.path.insert(0, "tests")
import numpy as np
from runner.synth import synthesize
from runner.backends.cuda import gemm, attention as attn
from runner.backends.cuda.ops import CudaOps
from runner.backends.numpy.ops import NumpyOps
import importlib.util
spec = importlib.util.spec_from_file_location("tg", "tests/test_grid_types_cuda.py")
src = Path("tests/test_grid_types_cuda.py").read_text().replace("from runner.engine.engine import Engine, EngineConfig  # noqa: E402", "")
ns = {"__name__": "tg"}
exec(compile(src, "tg", "exec"), ns)
base = Path("/tmp/g"); base.mkdir(exist_ok=True)
synthesize(base / "f32.gguf", "glm4moe", "tiny", "F32", 91)
path = ns["write_mixed_file"](base / "f32.gguf", base / "mix.gguf", 91)
ref = ns["build"](path, NumpyOps())
tokens = ns["prompt_ids"](ref.cfg.n_vocab, 70, seed=2)
want = ns["teacher_forced"](ref, tokens, ubatch=33)
def run(label):
    got = ns["teacher_forced"](ns["build"](path, CudaOps(prefill_precision="f16")), tokens, ubatch=33)
    print(label, "max err", float(np.abs(got - want).max()), "std", float(np.std(want)), "per-row max", np.abs(got - want).max(1).round(2).tolist()[:40])
run("as is")
gemm.DENSE_GEMM = "cublas"; run("cublas dense")
gemm.DENSE_GEMM = "rows"
orig = attn.attention
attn.attention = lambda *a, **k: orig(*a, **{**k, "precision": "f32"}); run("f32 attention")
attn.attention = orig
import runner.backends.cuda.ops as o
o.CudaOps._moe_grouped = lambda self, x, ids, weights, sets: o.route_cuda.combine(o._moe_pairs_f32(x, ids, *sets), weights); run("f32 experts")
