# ncu target: one decode attention call per (split size, n_kv) on the seed shape (H=16, Hkv=4, D=128), T=1.
import sys, cupy as cp
import runner.attention_cuda as a
for chunk in (256, 64):
    a.KV_CHUNK = chunk
    for n_kv in (1024, 8192, 32768):
        q = cp.random.standard_normal((1, 16, 128), dtype=cp.float32)
        k = cp.random.standard_normal((n_kv, 4, 128), dtype=cp.float32)
        v = cp.random.standard_normal((n_kv, 4, 128), dtype=cp.float32)
        pos = cp.asarray([n_kv - 1], dtype=cp.int32)
        a.attention(q, k, v, n_kv, pos, check_positions=False)  # compile, warm
        cp.cuda.Device().synchronize()
        cp.cuda.profiler.start()
        a.attention(q, k, v, n_kv, pos, check_positions=False)
        cp.cuda.Device().synchronize()
        cp.cuda.profiler.stop()
        print("profiled", chunk, n_kv, file=sys.stderr)
