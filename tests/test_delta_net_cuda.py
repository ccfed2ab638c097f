"""The hybrid families' kernels (cuda/delta_net.cu) against their numpy twins (backends/numpy/delta_net.py),
at the tiny presets' shapes, qwen35-35b-a3b's, and awkward ones (state sizes not a multiple of 32, odd head
counts, prompts not a multiple of the chunk).

Tolerances, and why they are not zero:
- sigmoid, delta_net_gates, ssm_conv's output: rtol 2e-6; CUDA's expf / log1pf and numpy's float32 exp /
  log1p are each a few ulp from exact; every add, multiply and divide rounds alike (unfused).
- l2_norm, rtol 1e-6: the row's float64 sum of squares in another order can move the float32 scale one ulp.
- rope_multi, atol 1e-5 with |x| ~ 1: double pow/sincos on both sides, as rope_neox's test says.
- gated_delta_net, atol 1e-5 (2e-5 for prompts, also against the chunked twin) with states ~ 1 and
  outputs ~ 0.1: S k and S q are float32 dot products summed in another order (and fused) than numpy's
  BLAS; a decay below 1 keeps the differences from growing (numpy's two forms differ by < 3e-6 here).
- gated_delta_net_chunked (tensor cores), atol 3e-4 on outputs and 2e-3 on states with the same data: every
  mma operand is rounded to tf32 (10 mantissa bits, relative error 2^-11), so a product summing n terms can be
  off by about 2^-11 sqrt(n) of its terms' size (2^-10 sum |a b| at worst), and the state's error from one
  chunk's V'^T K (V' ~ |v| ~ 1, k ~ 0.1, 64 tokens) feeds the next; decays below 1 keep it from growing. A
  CPU transliteration of both kernels (tf32 rounding emulated on the bits, mma from PTX's fragment layout)
  measured at most 8e-5 on outputs and 5e-4 on states over these shapes, and 2e-6 without the rounding.
- ssm_conv's window: exact; row_dot against a float64 sum, rtol 1e-6 (1e-5, atol 1e-4 against numpy's
  float32 BLAS dot).
The properties a recurrent state relies on are bit-exact on the device itself: a verify batch's rows and
states are a decode step's, and no op writes the state it is given.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from runner.backends.cuda.kernels import gpu_available
from runner.backends.numpy import delta_net

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402

from runner.backends.cuda import delta_net as delta_net_cuda  # noqa: E402
from runner.backends.cuda.ops import CudaOps  # noqa: E402
from runner.backends.hybrid_ops import HybridOps  # noqa: E402
from runner.gguf_file import TensorInfo  # noqa: E402

# (key heads, value heads, state size): the tiny presets, qwen35-35b-a3b / qwen3next-80b-a3b, awkward ones.
HEADS = [(2, 4, 64), (16, 32, 128), (3, 6, 48), (1, 3, 96), (2, 2, 256)]
CHUNKED_HEADS = HEADS[:4]  # the chunked kernels take state sizes that are multiples of 8 up to 128
CHUNKED_OUT_ATOL, CHUNKED_STATE_ATOL = 3e-4, 2e-3  # tf32 operands: see the docstring


def _weight(w: np.ndarray, name: str = "w") -> TensorInfo:
    return TensorInfo(name=name, qtype=GGMLQuantizationType.F32, shape=w.shape, data=w, offset=0)


def _delta_inputs(rng: np.random.Generator, n_tok: int, h_k: int, h_v: int, dim: int):
    q = delta_net.l2_norm(rng.standard_normal((n_tok, h_k, dim), dtype=np.float32), 1e-6)
    k = delta_net.l2_norm(rng.standard_normal((n_tok, h_k, dim), dtype=np.float32), 1e-6)
    v = rng.standard_normal((n_tok, h_v, dim), dtype=np.float32)
    g = -rng.uniform(0.005, 2.0, (n_tok, h_v)).astype(np.float32)
    beta = rng.uniform(0.0, 1.0, (n_tok, h_v)).astype(np.float32)
    state = rng.standard_normal((h_v, dim, dim), dtype=np.float32) * np.float32(0.3)
    return q, k, v, g, beta, state


def _on_device(*arrays: np.ndarray) -> list[cp.ndarray]:
    return [cp.asarray(a) for a in arrays]


def test_cuda_ops_implement_the_hybrid_ops_protocol() -> None:
    assert isinstance(CudaOps(), HybridOps)


def test_sigmoid_matches_numpy_twin() -> None:
    x = (np.random.default_rng(1).standard_normal((7, 1000)) * 30).astype(np.float32)  # saturating both ways
    got = cp.asnumpy(delta_net_cuda.sigmoid(cp.asarray(x)))
    np.testing.assert_allclose(got, delta_net.sigmoid(x), rtol=2e-6, atol=1e-37)


@pytest.mark.parametrize("shape", [(1, 2, 64), (5, 16, 128), (9, 3, 48), (8, 1, 257)])
@pytest.mark.parametrize("eps", [1e-6, 1e-5])
def test_l2_norm_matches_numpy_twin_per_head(shape: tuple[int, ...], eps: float) -> None:
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 3, shape[:-1] + (1,))).astype(np.float32)
    got = cp.asnumpy(delta_net_cuda.l2_norm(cp.asarray(x), eps))
    np.testing.assert_allclose(got, delta_net.l2_norm(x, eps), rtol=1e-6, atol=0)


@pytest.mark.parametrize(("heads", "head_dim", "n_rot", "sections"), [
    (4, 64, 16, (2, 2, 0, 0)),  # the tiny qwen35moe: pairs 2 and 6 stay at position 0
    (2, 256, 64, (11, 11, 10, 0)),  # qwen35-35b-a3b's K heads
    (3, 40, 24, (3, 2, 1, 1)),  # an e section and sectors past t+h+w
])
def test_rope_multi_matches_numpy_twin(heads: int, head_dim: int, n_rot: int, sections) -> None:
    rng = np.random.default_rng(head_dim)
    positions = np.array([0, 1, 2, 17, 511, 4096, 65535, 262143], dtype=np.int64)
    x = rng.standard_normal((len(positions), heads, head_dim)).astype(np.float32)
    got = delta_net_cuda.rope_multi(cp.asarray(x), cp.asarray(positions.astype(np.int32)), n_rot, 1e7, sections)
    want = delta_net.rope_multi(x, positions, n_rot, 1e7, sections)
    np.testing.assert_allclose(cp.asnumpy(got), want, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(cp.asnumpy(got)[..., n_rot:], x[..., n_rot:])


@pytest.mark.parametrize("shape", [(1, 4), (8, 32), (37, 6)])
def test_delta_net_gates_match_numpy_twin(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(shape[0])
    alpha = (rng.standard_normal(shape) * 12).astype(np.float32)  # both sides of softplus's 20 cut-off
    beta = (rng.standard_normal(shape) * 5).astype(np.float32)
    dt_bias = rng.standard_normal(shape[1]).astype(np.float32)
    a = -np.exp(rng.standard_normal(shape[1])).astype(np.float32)
    g, write = delta_net_cuda.delta_net_gates(*_on_device(alpha, beta, dt_bias, a))
    want_g, want_write = delta_net.delta_net_gates(alpha, beta, dt_bias, a)
    np.testing.assert_allclose(cp.asnumpy(g), want_g, rtol=2e-6, atol=1e-37)
    np.testing.assert_allclose(cp.asnumpy(write), want_write, rtol=2e-6, atol=1e-37)


@pytest.mark.parametrize("channels", [512, 8192, 300])  # tiny conv_dim, qwen35-35b-a3b's, awkward
@pytest.mark.parametrize("n_tok", [1, 3, 8, 37])
@pytest.mark.parametrize("kernel", [4, 2])
def test_ssm_conv_matches_numpy_twin_and_hands_over_the_window(channels: int, n_tok: int, kernel: int) -> None:
    rng = np.random.default_rng(channels + n_tok + kernel)
    x = rng.standard_normal((n_tok, channels)).astype(np.float32)
    state = rng.standard_normal((kernel - 1, channels)).astype(np.float32)
    w = (rng.standard_normal((channels, kernel)) * 0.5).astype(np.float32)
    state_dev = cp.asarray(state)
    y, window = delta_net_cuda.ssm_conv(cp.asarray(x), state_dev, cp.asarray(w))
    want_y, want_window = delta_net.ssm_conv(x, state, w)
    np.testing.assert_array_equal(cp.asnumpy(window), want_window)
    np.testing.assert_allclose(cp.asnumpy(y), want_y, rtol=2e-6, atol=1e-6)
    np.testing.assert_array_equal(cp.asnumpy(state_dev), state)  # the old state is not written


@pytest.mark.parametrize(("h_k", "h_v", "dim"), HEADS)
@pytest.mark.parametrize("grouped", [True, False])
@pytest.mark.parametrize("n_tok", [1, 2, 5, 8])
def test_decode_and_verify_rows_match_numpy_with_every_row_state(h_k: int, h_v: int, dim: int, grouped: bool,
                                                                  n_tok: int) -> None:
    q, k, v, g, beta, state = _delta_inputs(np.random.default_rng(dim * 10 + n_tok), n_tok, h_k, h_v, dim)
    state_dev = cp.asarray(state)
    out, states = delta_net_cuda.gated_delta_net(*_on_device(q, k, v, g, beta), state_dev, grouped,
                                                 keep_states=True)
    want_out, want_states = delta_net.gated_delta_net(q, k, v, g, beta, state, grouped, keep_states=True)
    assert states.shape == (n_tok, h_v, dim, dim)
    np.testing.assert_allclose(cp.asnumpy(out), want_out, atol=1e-5, rtol=0)
    np.testing.assert_allclose(cp.asnumpy(states), want_states, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(cp.asnumpy(state_dev), state)


@pytest.mark.parametrize(("h_k", "h_v", "dim"), HEADS[:3])
@pytest.mark.parametrize("n_tok", [9, 63, 64, 65, 200])
def test_prompt_rows_match_the_token_by_token_and_chunked_twins(h_k: int, h_v: int, dim: int, n_tok: int) -> None:
    q, k, v, g, beta, state = _delta_inputs(np.random.default_rng(n_tok), n_tok, h_k, h_v, dim)
    out, states = delta_net_cuda.gated_delta_net(*_on_device(q, k, v, g, beta, state), False, keep_states=False,
                                                 tensor_cores=False)  # the scan at any length
    assert states.shape == (1, h_v, dim, dim)
    for want_out, want_state in (delta_net.gated_delta_net(q, k, v, g, beta, state, False, keep_states=False),
                                 delta_net.gated_delta_net_chunked(q, k, v, g, beta, state, False)):
        np.testing.assert_allclose(cp.asnumpy(out), want_out, atol=2e-5, rtol=0)
        np.testing.assert_allclose(cp.asnumpy(states), want_state, atol=2e-5, rtol=0)


@pytest.mark.parametrize(("h_k", "h_v", "dim"), CHUNKED_HEADS)
@pytest.mark.parametrize("grouped", [True, False])
@pytest.mark.parametrize("n_tok", [1, 63, 64, 65, 200, 1000])
def test_chunked_prompt_matches_the_token_by_token_twin(h_k: int, h_v: int, dim: int, grouped: bool,
                                                         n_tok: int) -> None:
    q, k, v, g, beta, state = _delta_inputs(np.random.default_rng(n_tok + dim), n_tok, h_k, h_v, dim)
    state_dev = cp.asarray(state)
    out, states = delta_net_cuda.gated_delta_net_chunked(*_on_device(q, k, v, g, beta), state_dev, grouped)
    want_out, want_state = delta_net.gated_delta_net(q, k, v, g, beta, state, grouped, keep_states=False)
    assert out.shape == (n_tok, h_v, dim) and states.shape == (1, h_v, dim, dim)
    np.testing.assert_allclose(cp.asnumpy(out), want_out, atol=CHUNKED_OUT_ATOL, rtol=0)
    np.testing.assert_allclose(cp.asnumpy(states), want_state, atol=CHUNKED_STATE_ATOL, rtol=0)
    np.testing.assert_array_equal(cp.asnumpy(state_dev), state)  # the given state is not written


@pytest.mark.parametrize(("h_k", "h_v", "dim"), CHUNKED_HEADS)
@pytest.mark.parametrize("n_tok", [65, 1000])
def test_chunked_prompt_matches_the_scan_on_the_device(h_k: int, h_v: int, dim: int, n_tok: int) -> None:
    inputs = _on_device(*_delta_inputs(np.random.default_rng(7 * n_tok + dim), n_tok, h_k, h_v, dim))
    scan_out, scan_state = delta_net_cuda.gated_delta_net(*inputs, True, keep_states=False, tensor_cores=False)
    out, states = delta_net_cuda.gated_delta_net_chunked(*inputs, True)
    np.testing.assert_allclose(cp.asnumpy(out), cp.asnumpy(scan_out), atol=CHUNKED_OUT_ATOL, rtol=0)
    np.testing.assert_allclose(cp.asnumpy(states), cp.asnumpy(scan_state), atol=CHUNKED_STATE_ATOL, rtol=0)


@pytest.mark.parametrize(("h_k", "h_v", "dim"), [(2, 4, 64), (16, 32, 128)])
def test_chunked_prompt_from_zero_and_carried_states(h_k: int, h_v: int, dim: int) -> None:
    """A prompt from a zero state, and the same prompt in two calls with the first's state handed to the second
    (how micro-batches carry it), both against one token-by-token pass."""
    q, k, v, g, beta, _ = _delta_inputs(np.random.default_rng(dim), 300, h_k, h_v, dim)
    zero = np.zeros((h_v, dim, dim), dtype=np.float32)
    want_out, want_state = delta_net.gated_delta_net(q, k, v, g, beta, zero, False, keep_states=False)
    dev = _on_device(q, k, v, g, beta)
    out, states = delta_net_cuda.gated_delta_net_chunked(*dev, cp.asarray(zero), False)
    np.testing.assert_allclose(cp.asnumpy(out), want_out, atol=CHUNKED_OUT_ATOL, rtol=0)
    np.testing.assert_allclose(cp.asnumpy(states), want_state, atol=CHUNKED_STATE_ATOL, rtol=0)
    first = [cp.ascontiguousarray(a[:100]) for a in dev]
    second = [cp.ascontiguousarray(a[100:]) for a in dev]
    out_a, mid = delta_net_cuda.gated_delta_net_chunked(*first, cp.asarray(zero), False)
    out_b, last = delta_net_cuda.gated_delta_net_chunked(*second, mid[0], False)
    np.testing.assert_allclose(cp.asnumpy(cp.concatenate([out_a, out_b])), want_out, atol=CHUNKED_OUT_ATOL, rtol=0)
    np.testing.assert_allclose(cp.asnumpy(last), want_state, atol=CHUNKED_STATE_ATOL, rtol=0)


def test_prompts_take_the_chunked_kernels_from_the_threshold_and_the_scan_otherwise() -> None:
    """Bit-equality with one path or the other (both are deterministic): chunked from CHUNKED_MIN_TOKENS tokens
    up without keep_states at a size it takes; the scan below it, with keep_states (verify), at f32 precision
    (tensor_cores off) and at a state size of 256."""
    rng = np.random.default_rng(3)

    def same(a, b) -> bool:
        return all(np.array_equal(cp.asnumpy(x), cp.asnumpy(y)) for x, y in zip(a, b))

    n = delta_net_cuda.CHUNKED_MIN_TOKENS
    for n_tok, dim, keep, tensor_cores, chunked in [(n, 64, False, True, True), (n - 1, 64, False, True, False),
                                                    (n, 64, True, True, False), (n, 64, False, False, False),
                                                    (n, 256, False, True, False), (n, 60, False, True, False)]:
        q, k, v, g, beta, state = _on_device(*_delta_inputs(rng, n_tok, 2, 4, dim))
        got = delta_net_cuda.gated_delta_net(q, k, v, g, beta, state, True, keep, tensor_cores=tensor_cores)
        scan = delta_net_cuda.gated_delta_net(q, k, v, g, beta, state, True, keep, tensor_cores=False)
        assert same(got, scan) != chunked, (n_tok, dim, keep, tensor_cores)
        if chunked:
            assert same(got, delta_net_cuda.gated_delta_net_chunked(q, k, v, g, beta, state, True))


@pytest.mark.parametrize(("h_k", "h_v", "dim"), [(2, 4, 64), (16, 32, 128)])
def test_a_verify_batch_gives_the_bits_of_decode_steps(h_k: int, h_v: int, dim: int) -> None:
    """What speculative verify needs: row t of a batch, and the state after it, are a decode step's bits."""
    q, k, v, g, beta, state = _on_device(*_delta_inputs(np.random.default_rng(5), 8, h_k, h_v, dim))
    out, states = delta_net_cuda.gated_delta_net(q, k, v, g, beta, state, True, keep_states=True)
    s = state
    for t in range(8):
        one, after = delta_net_cuda.gated_delta_net(q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1],
                                                    beta[t : t + 1], s, True, keep_states=False)
        np.testing.assert_array_equal(cp.asnumpy(one[0]), cp.asnumpy(out[t]))
        np.testing.assert_array_equal(cp.asnumpy(after[0]), cp.asnumpy(states[t]))
        s = after[0]
    long_out, last = delta_net_cuda.gated_delta_net(q, k, v, g, beta, state, True, keep_states=False)
    np.testing.assert_array_equal(cp.asnumpy(long_out), cp.asnumpy(out))
    np.testing.assert_array_equal(cp.asnumpy(last[0]), cp.asnumpy(states[-1]))


@pytest.mark.parametrize("shape", [(1, 2048), (8, 4096), (3, 257)])
def test_row_dot_is_each_row_s_dot_product(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(shape[1])
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(shape[1]).astype(np.float32)
    got = cp.asnumpy(delta_net_cuda.row_dot(cp.asarray(x), cp.asarray(w)))
    np.testing.assert_allclose(got, (x.astype(np.float64) @ w.astype(np.float64)).astype(np.float32), rtol=1e-6)


def test_cuda_ops_methods_read_their_weights_like_numpy_ops() -> None:
    """The CudaOps entry points (weights as TensorInfo, a 1-D linear weight) against NumpyOps'."""
    from runner.backends.numpy.ops import NumpyOps

    rng = np.random.default_rng(11)
    cuda, ref = CudaOps(), NumpyOps()
    x = rng.standard_normal((5, 512)).astype(np.float32)
    state = rng.standard_normal((3, 512)).astype(np.float32)
    conv = _weight(rng.standard_normal((512, 4)).astype(np.float32), "blk.0.ssm_conv1d.weight")
    cuda.check_weights([conv])
    y, window = cuda.ssm_conv(cp.asarray(x), cp.asarray(state), conv)
    want_y, want_window = ref.ssm_conv(x, state, conv)
    np.testing.assert_allclose(cp.asnumpy(y), want_y, rtol=2e-6, atol=1e-6)
    np.testing.assert_array_equal(cp.asnumpy(window), want_window)

    alpha, beta = rng.standard_normal((5, 4)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    dt_bias = _weight(rng.standard_normal(4).astype(np.float32), "blk.0.ssm_dt.bias")
    a = _weight(-np.exp(rng.standard_normal(4)).astype(np.float32), "blk.0.ssm_a")
    for got, want in zip(cuda.delta_net_gates(cp.asarray(alpha), cp.asarray(beta), dt_bias, a),
                         ref.delta_net_gates(alpha, beta, dt_bias, a)):
        np.testing.assert_allclose(cp.asnumpy(got), want, rtol=2e-6, atol=1e-37)

    gate = _weight(rng.standard_normal(512).astype(np.float32), "blk.0.ffn_gate_inp_shexp.weight")
    cuda.check_weights([gate])
    got = cuda.linear(cp.asarray(x), gate)
    assert got.shape == (5,)
    np.testing.assert_allclose(cp.asnumpy(got), ref.linear(x, gate), rtol=1e-5, atol=1e-4)

    positions = np.arange(40, 45)
    xr = rng.standard_normal((5, 4, 64)).astype(np.float32)
    got = cuda.rope_multi(cp.asarray(xr), positions, 16, 1e7, (2, 2, 0, 0))
    np.testing.assert_allclose(cp.asnumpy(got), ref.rope_multi(xr, positions, 16, 1e7, (2, 2, 0, 0)), atol=1e-5)
