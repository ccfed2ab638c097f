"""The whole forward pass on CudaOps against NumpyOps (float32 activations) on synthesized models.

Tolerances: decode-sized batches run float32 GEMV kernels whose summation order differs from numpy's
BLAS, so logits agree to float32 rounding (~1e-5 on logits of std ~4); prompts longer than
SMALL_BATCH_ROWS go through fp16 GEMMs (fp16 operands, float32 accumulation), ~1e-3 relative, so the
teacher-forced bound there is 2e-2 x the logits' std unless prefill runs in f32. Greedy tokens must be
identical. Batch invariance is bitwise: a verify batch of up to 8 rows gives each row exactly the
logits that single-token decode gives. Both backends cache K/V as f16 (the default) or f32, rounded
the same way as they are stored, so the bounds hold for either. The files are written with random
quant blocks (synth `direct=True`), so no llama.cpp is needed on the GPU box.
"""

from __future__ import annotations

import numpy as np
import pytest

from runner.backends.cuda.kernels import gpu_available

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402

from runner.backends.budget import DeviceBudget  # noqa: E402
from runner.backends.cuda.ops import CudaOps  # noqa: E402
from runner.backends.numpy.ops import NumpyOps  # noqa: E402
from runner.errors import DeviceMemoryError  # noqa: E402
from runner.gguf_file import open_gguf  # noqa: E402
from runner.models import MoETransformer  # noqa: E402
from runner.models.config import model_config  # noqa: E402
from runner.models.transformer import token_groups  # noqa: E402
from runner.models.weights import MoEWeights, load_weights  # noqa: E402

CASES = [("glm4moe", "F32"), ("glm4moe", "Q8_0"), ("glm4moe", "Q4_K_M"), ("glm4moe", "IQ4_XS"),
         ("qwen3moe", "F32"), ("qwen3moe", "Q4_K_M"), ("qwen3moe", "Q6_K")]


def build(path, ops) -> MoETransformer:
    f = open_gguf(path)
    cfg = model_config(f)
    w = load_weights(f, cfg)
    ops.check_weights(w.all_tensors())
    return MoETransformer(cfg, w, ops)


def teacher_forced(model: MoETransformer, tokens: np.ndarray, ubatch: int) -> np.ndarray:
    kv = model.new_kv_cache(256)
    rows = []
    for start in range(0, len(tokens), ubatch):
        logits, _ = model.forward(tokens[start : start + ubatch], kv, all_logits=True)
        rows.append(model.ops.to_host(logits))
    return np.concatenate(rows)


def greedy(model: MoETransformer, prompt: np.ndarray, n: int) -> list[int]:
    kv = model.new_kv_cache(256)
    logits, _ = model.forward(prompt, kv)
    out = [int(np.argmax(model.ops.to_host(logits)[-1]))]
    while len(out) < n:
        logits, _ = model.forward(np.asarray(out[-1:]), kv)
        out.append(int(np.argmax(model.ops.to_host(logits)[-1])))
    return out


def prompt_ids(n_vocab: int, n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n_vocab, size=n)


KV_TYPES = ["f16", "f32"]
# Float32 math on both sides: logits within 1e-4 x their std; over an f16 cache a last-bit difference in a
# K or V element may round it to the neighbouring f16 value (2^-11 relative), measured on numpy across
# micro-batch sizes at about 3.5e-5 x std; on the H200 CUDA against numpy reached 3.7e-4 x std (qwen3moe F32,
# ubatch 33), so the bound is one f16 step, 2^-10.
F32_BOUND = {"f32": 1e-4, "f16": 2.0 ** -10}


@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize("arch,quant", CASES)
def test_decode_sized_batches_match_numpy(synth_model, arch: str, quant: str, kv_type: str) -> None:
    path = synth_model(arch, quant, direct=quant not in ("F32",))
    ref, gpu = build(path, NumpyOps(kv_type=kv_type)), build(path, CudaOps(prefill_precision="f32", kv_type=kv_type))
    tokens = prompt_ids(ref.cfg.n_vocab, 40)
    want = teacher_forced(ref, tokens, ubatch=5)  # every chunk takes the GEMV path
    got = teacher_forced(gpu, tokens, ubatch=5)
    assert np.abs(got - want).max() <= F32_BOUND[kv_type] * max(1.0, float(np.std(want)))
    assert greedy(gpu, tokens[:6], 24) == greedy(ref, tokens[:6], 24)


@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize("arch,quant", CASES)
@pytest.mark.parametrize("precision", ["f32", "f16"])
def test_prefill_batches_match_numpy(synth_model, arch: str, quant: str, precision: str, kv_type: str) -> None:
    path = synth_model(arch, quant, direct=quant not in ("F32",))
    ref = build(path, NumpyOps(kv_type=kv_type))
    gpu = build(path, CudaOps(prefill_precision=precision, kv_type=kv_type))
    tokens = prompt_ids(ref.cfg.n_vocab, 70, seed=2)
    want, want_routes = routed(ref, lambda: teacher_forced(ref, tokens, ubatch=33))  # 33 + 33 + 4 rows: GEMM, GEMM, GEMV
    got, got_routes = routed(gpu, lambda: teacher_forced(gpu, tokens, ubatch=33))
    bound = (F32_BOUND[kv_type] if precision == "f32" else 2e-2) * float(np.std(want))
    # fp16 operands can flip a top-k choice where two experts' router scores nearly tie (glm4moe F32 over an f32
    # cache on the H200: position 56 in the first MoE layer), and then that row's later layers and the later rows
    # attending to it may route differently too (there: row 56 in the second MoE layer, row 67). So: at most one
    # origin, the only row whose lowest differing layer is the lowest of all, it comes first, and every row
    # before it stays within the bound. A kernel error would break rows before any flip, or start many.
    flips = np.argwhere((got_routes != want_routes).any(axis=-1))  # (row, MoE layer)
    first = int(flips[:, 0].min()) if len(flips) else len(tokens)
    origins = {int(r) for r, layer in flips if layer == flips[:, 1].min()}
    assert len(origins) <= (0 if precision == "f32" else 1) and origins <= {first}, f"routing differs at {flips.tolist()}"
    assert np.abs(got[:first] - want[:first]).max() <= bound
    agree = (got[:first].argmax(-1) == want[:first].argmax(-1)).mean()
    assert agree >= 0.97, f"argmax agrees at {agree:.0%} of positions"
    assert greedy(gpu, tokens[:30], 16) == greedy(ref, tokens[:30], 16)


def routed(model: MoETransformer, run) -> tuple[np.ndarray, np.ndarray]:
    """run()'s result and the experts each row was routed to, [rows, MoE layers, k] sorted per row."""
    calls, route = [], model.ops.route

    def recording(*args, **kwargs):
        ids, weights = route(*args, **kwargs)
        calls.append(np.sort(np.asarray(model.ops.to_host(ids)), axis=-1))
        return ids, weights

    model.ops.route = recording
    try:
        result = run()
    finally:
        del model.ops.route
    n_moe = sum(isinstance(layer.ffn, MoEWeights) for layer in model.weights.layers)
    chunks = [np.stack(calls[i : i + n_moe], axis=1) for i in range(0, len(calls), n_moe)]
    return result, np.concatenate(chunks)


@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize("arch,quant", [("glm4moe", "Q4_K_M"), ("qwen3moe", "Q8_0")])
def test_verify_batch_rows_equal_single_token_decode_bitwise(synth_model, arch: str, quant: str, kv_type: str) -> None:
    gpu = build(synth_model(arch, quant, direct=True), CudaOps(kv_type=kv_type))
    tokens = prompt_ids(gpu.cfg.n_vocab, 20, seed=3)
    for n_rows in range(1, 9):
        kv = gpu.new_kv_cache(64)
        gpu.forward(tokens[:12], kv)
        batch, _ = gpu.forward(tokens[12 : 12 + n_rows], kv, all_logits=True)
        kv.truncate(12)
        singles = [gpu.ops.to_host(gpu.forward(tokens[12 + i : 13 + i], kv)[0])[0] for i in range(n_rows)]
        assert np.array_equal(gpu.ops.to_host(batch), np.stack(singles)), f"{n_rows} rows"


def test_weights_over_the_budget_fail_naming_the_tensor(synth_model) -> None:
    path = synth_model("glm4moe", "Q8_0", direct=True)
    with pytest.raises(DeviceMemoryError, match=r"weight .* needs .* VRAM budget"):
        build(path, CudaOps(DeviceBudget(1 << 20)))


def test_peak_reserved_memory_stays_within_the_budget(synth_model) -> None:
    budget = DeviceBudget(256 << 20)
    gpu = build(synth_model("glm4moe", "Q4_K_M", direct=True), CudaOps(budget))
    greedy(gpu, prompt_ids(gpu.cfg.n_vocab, 40), 8)
    assert 0 < budget.peak_bytes <= budget.limit_bytes
    assert cp.get_default_memory_pool().total_bytes() <= budget.limit_bytes


@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize("arch,quant", [("glm4moe", "Q4_K_M"), ("qwen3moe", "F32")])
def test_graph_replayed_decode_equals_eager_decode_bitwise(synth_model, arch: str, quant: str, kv_type: str) -> None:
    """The graph writes K/V at its device-side position, rounded to the cache's type as an eager step does."""
    path = synth_model(arch, quant, direct=quant != "F32")
    eager = build(path, CudaOps(graphs=False, kv_type=kv_type))
    graphed = build(path, CudaOps(graphs=True, kv_type=kv_type))
    prompt = prompt_ids(eager.cfg.n_vocab, 9, seed=4)
    runs = []
    for model in (eager, graphed):
        kv = model.new_kv_cache(64)
        model.forward(prompt, kv)
        token, rows = int(prompt[-1]), []
        for _ in range(20):
            logits, _ = model.ops.decode_forward(model, token, kv)
            rows.append(model.ops.to_host(logits)[-1])
            token = int(np.argmax(rows[-1]))
        kv.truncate(5)  # a rollback: the same graph keeps serving at the new position
        logits, _ = model.ops.decode_forward(model, token, kv)
        rows.append(model.ops.to_host(logits)[-1])
        runs.append(np.stack(rows))
    assert np.array_equal(runs[0], runs[1])
    (graph,) = graphed.ops._decode_graphs.values()
    assert graph.replays == 20  # step 1 warms up eagerly, step 2 captures and replays


@pytest.mark.parametrize("arch,quant", [("glm4moe", "Q4_K_M"), ("qwen3moe", "F32")])
def test_graph_replayed_verify_batches_equal_eager_batches_bitwise(synth_model, arch: str, quant: str) -> None:
    """Verify batches of 2 to 4 rows replay a graph per row count, beside the decode graph on the same cache:
    every row's logits and hidden state are the eager batch's bits, at whatever positions the rollbacks leave."""
    path = synth_model(arch, quant, direct=quant != "F32")
    eager = build(path, CudaOps(graphs=False))
    graphed = build(path, CudaOps(graphs=True))
    n_vocab = eager.cfg.n_vocab
    prompt = prompt_ids(n_vocab, 9, seed=5)
    sizes = [2, 3, 4] * 4
    batches = [prompt_ids(n_vocab, n, seed=10 + i) for i, n in enumerate(sizes)]
    runs = []
    for model in (eager, graphed):
        kv = model.new_kv_cache(64)
        model.forward(prompt, kv)
        out = []
        for i, batch in enumerate(batches):
            logits, hidden = model.ops.verify_forward(model, batch, kv)
            out += [model.ops.to_host(logits), model.ops.to_host(hidden)]
            assert out[-2].shape == (len(batch), n_vocab)
            kv.truncate(kv.n_tokens - len(batch) + 1 + i % len(batch))  # keep some rows, as acceptance does
            logits, _ = model.ops.decode_forward(model, int(np.argmax(out[-2][0])), kv)  # a depth-0 step
            out.append(model.ops.to_host(logits))
        runs.append(out)
    assert all(np.array_equal(a, b) for a, b in zip(*runs))
    ops, kv_graphs = graphed.ops, list(graphed.ops._decode_graphs.values())
    assert sorted(g.rows for g in kv_graphs) == [1, 2, 3, 4]
    for rows in (2, 3, 4):
        graph = next(g for g in kv_graphs if g.rows == rows)
        assert ops.decode_graph(graph.kv, rows) is graph
        assert graph.replays == sizes.count(rows) - 1  # the first batch warms up, the second captures
    assert ops.decode_graph(kv_graphs[0].kv).rows == 1 and ops.decode_graph(kv_graphs[0].kv).replays == len(sizes) - 1
    ops.invalidate_graphs()
    assert all(ops.decode_graph(g.kv, g.rows) is None for g in kv_graphs)


def test_attention_checks_positions_on_the_host_without_draining_the_stream(monkeypatch) -> None:
    """CudaOps.attention has the chunk's positions on the host: it checks them there (a position past the cached
    keys fails the same assertion attention() makes, naming the span) and never runs its device-to-host copy."""
    from runner.backends.cuda import attention as attention_cuda

    def device_check(*_args, **_kwargs):
        raise AssertionError("the device-side position check ran (a stream sync per chunk and layer)")

    monkeypatch.setattr(attention_cuda, "_check_positions", device_check)
    ops = CudaOps()
    rng = np.random.default_rng(0)
    q = cp.asarray(rng.standard_normal((3, 4, 32), dtype=np.float32))
    kv = cp.asarray(rng.standard_normal((8, 2, 32)).astype(np.float16))
    out = ops.attention(q, kv, kv, np.arange(5, 8))
    assert out.shape == (3, 4 * 32) and bool(cp.isfinite(out).all())
    with pytest.raises(AssertionError, match=r"q_positions span \[6, 8\], but only keys 0..7 are cached"):
        ops.attention(q, kv, kv, np.arange(6, 9))


@pytest.mark.parametrize("arch,quant", [("glm4moe", "Q4_K_M"), ("qwen3moe", "F32")])
@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize("prefix", [0, 37])
def test_layer_major_groups_equal_chunk_by_chunk_bitwise(synth_model, arch: str, quant: str, kv_type: str,
                                                         prefix: int) -> None:
    """The prompt kernels are row-invariant, so a layer-major prompt whose attention and experts run over one
    group of micro-batches gives the chunk-by-chunk logits and K/V bit for bit; 40-row chunks make 64-row
    attention blocks straddle chunk boundaries (their extra key tiles are fully masked: a factor of exactly 1),
    a cached prefix starts the group mid-sequence, and the last 5 rows (small-batch kernels) stay alone."""
    gpu = build(synth_model(arch, quant, direct=True), CudaOps(kv_type=kv_type))
    sizes = [40, 40, 40, 40, 20, 5]
    assert token_groups(sizes, 1024) == [[0, 1, 2, 3, 4], [5]]
    n = prefix + sum(sizes)
    tokens = prompt_ids(gpu.cfg.n_vocab, n)
    bounds = np.cumsum([prefix, *sizes])
    chunks = [tokens[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
    runs = []
    for group_tokens in (0, 1024):
        kv = gpu.new_kv_cache(256)
        if prefix:
            gpu.forward(tokens[:prefix], kv)
        out = gpu.forward_layer_major(chunks, kv, all_logits=True, group_tokens=group_tokens)
        runs.append(([cp.asnumpy(logits) for logits, _ in out], kv))
    (alone, kv_alone), (grouped, kv_grouped) = runs
    assert len(alone) == len(grouped) == len(sizes)
    assert all(np.array_equal(a, g) for a, g in zip(alone, grouped))
    for layer in range(gpu.cfg.n_layer):
        assert np.array_equal(cp.asnumpy(kv_alone.k[layer][:n]), cp.asnumpy(kv_grouped.k[layer][:n]))
        assert np.array_equal(cp.asnumpy(kv_alone.v[layer][:n]), cp.asnumpy(kv_grouped.v[layer][:n]))
