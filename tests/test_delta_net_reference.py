"""The numpy reference of the hybrid families' ops (runner/backends/numpy/delta_net.py) against the
formulas written out plainly in float64, and the properties a recurrent state relies on: a batch split
anywhere gives the same bits, and the per-row states are the states a shorter batch ends in."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from runner.backends.hybrid_ops import HybridOps
from runner.backends.numpy import delta_net
from runner.backends.numpy.ops import NumpyOps


def _inputs(rng: np.random.Generator, n_tok: int, h_k: int = 2, h_v: int = 4, dim: int = 8):
    q = delta_net.l2_norm(rng.standard_normal((n_tok, h_k, dim), dtype=np.float32), 1e-6)
    k = delta_net.l2_norm(rng.standard_normal((n_tok, h_k, dim), dtype=np.float32), 1e-6)
    v = rng.standard_normal((n_tok, h_v, dim), dtype=np.float32)
    g = -rng.uniform(0.01, 2.0, (n_tok, h_v)).astype(np.float32)
    beta = rng.uniform(0.0, 1.0, (n_tok, h_v)).astype(np.float32)
    state = rng.standard_normal((h_v, dim, dim), dtype=np.float32) * np.float32(0.3)
    return q, k, v, g, beta, state


def _delta_rule_float64(q, k, v, g, beta, state, key_head):
    """The gated delta rule head by head, token by token: S <- e^g S; S += beta (v - S k) k^T; o = S q / sqrt(d)."""
    n_tok, h_v, dim = v.shape
    s = state.astype(np.float64).copy()
    out = np.zeros((n_tok, h_v, dim))
    for t in range(n_tok):
        for h in range(h_v):
            kt, qt = k[t, key_head(h)].astype(np.float64), q[t, key_head(h)].astype(np.float64)
            s[h] *= np.exp(g[t, h])
            s[h] += beta[t, h] * np.outer(v[t, h] - s[h] @ kt, kt)
            out[t, h] = s[h] @ qt / np.sqrt(dim)
    return out, s


@pytest.mark.parametrize(("grouped", "key_head"), [(True, lambda h: h // 2), (False, lambda h: h % 2)])
def test_gated_delta_net_is_the_delta_rule_with_the_value_head_order_given(grouped: bool, key_head) -> None:
    q, k, v, g, beta, state = _inputs(np.random.default_rng(1), 9)
    out, states = delta_net.gated_delta_net(q, k, v, g, beta, state, grouped, keep_states=False)
    want_out, want_state = _delta_rule_float64(q, k, v, g, beta, state, key_head)
    np.testing.assert_allclose(out, want_out, atol=2e-5)
    np.testing.assert_allclose(states[0], want_state, atol=2e-5)
    other, _ = delta_net.gated_delta_net(q, k, v, g, beta, state, not grouped, keep_states=False)
    assert np.abs(other - want_out).max() > 0.1  # the wrong order is not a rounding difference


def test_a_batch_split_anywhere_gives_the_same_bits_and_every_row_state() -> None:
    q, k, v, g, beta, state = _inputs(np.random.default_rng(2), 7)
    out, rows = delta_net.gated_delta_net(q, k, v, g, beta, state, False, keep_states=True)
    s = state
    for t in range(7):  # one row at a time, each from the state the last one left
        one, after = delta_net.gated_delta_net(q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1],
                                               beta[t : t + 1], s, False, keep_states=False)
        np.testing.assert_array_equal(one[0], out[t])
        np.testing.assert_array_equal(after[0], rows[t])
        s = after[0]


def test_ssm_conv_continues_its_state_and_hands_over_the_window() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((10, 6), dtype=np.float32)
    w = rng.standard_normal((6, 4), dtype=np.float32)
    state = rng.standard_normal((3, 6), dtype=np.float32)
    y, window = delta_net.ssm_conv(x, state, w)
    padded = np.concatenate([state, x]).astype(np.float64)
    conv = np.stack([sum(padded[t + j] * w[:, j] for j in range(4)) for t in range(10)])
    np.testing.assert_allclose(y, conv / (1 + np.exp(-conv)), rtol=1e-5, atol=1e-6)
    y1, w1 = delta_net.ssm_conv(x[:4], state, w)  # the first 4 rows, then the rest from their window's tail
    y2, _ = delta_net.ssm_conv(x[4:], w1[-3:], w)
    np.testing.assert_array_equal(np.concatenate([y1, y2]), y)
    np.testing.assert_array_equal(window[-3:], x[-3:])


def test_l2_norm_gives_unit_rows_and_gates_are_softplus_and_sigmoid() -> None:
    x = np.random.default_rng(4).standard_normal((5, 3, 16), dtype=np.float32)
    np.testing.assert_allclose(np.linalg.norm(delta_net.l2_norm(x, 1e-12), axis=-1), 1.0, rtol=1e-6)
    alpha, beta = np.array([[-30.0, 0.0, 25.0]], np.float32), np.array([[0.0, 2.0, -2.0]], np.float32)
    g, b = delta_net.delta_net_gates(alpha, beta, np.float32([0.5, 0.0, 0.0]), np.float32([-1.0, -2.0, -0.5]))
    np.testing.assert_allclose(g, [[-np.log1p(np.exp(-29.5)), -2 * np.log(2), -12.5]], rtol=1e-6)
    np.testing.assert_allclose(b, 1 / (1 + np.exp(-beta)), rtol=1e-6)


def test_rope_multi_rotates_text_like_neox_except_pairs_in_the_e_section() -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 2, 32), dtype=np.float32)
    positions = np.arange(3, 9)
    neox = NumpyOps().rope_neox(x, positions, 16, 10000.0)
    np.testing.assert_allclose(delta_net.rope_multi(x, positions, 16, 10000.0, (3, 3, 2, 0)), neox, atol=1e-6)
    # (2, 2, 2, 1): 7 sections over 8 pairs; pair 6 is the e section's, which text does not rotate
    mixed = delta_net.rope_multi(x, positions, 16, 10000.0, (2, 2, 2, 1))
    unrotated = [6, 14]  # pair 6 is dims 6 and 6 + 8
    np.testing.assert_array_equal(mixed[..., unrotated], x[..., unrotated])
    rotated = [d for d in range(32) if d not in unrotated]
    np.testing.assert_allclose(mixed[..., rotated], neox[..., rotated], atol=1e-6)


def test_numpy_ops_implements_the_hybrid_ops_protocol_with_its_parameters() -> None:
    assert isinstance(NumpyOps(), HybridOps)
    for name, fn in vars(HybridOps).items():
        if inspect.isfunction(fn) and not name.startswith("_"):
            assert list(inspect.signature(getattr(NumpyOps, name)).parameters) == list(
                inspect.signature(fn).parameters), name


@pytest.mark.parametrize(("n_tok", "chunk"), [(1, 16), (5, 16), (16, 16), (17, 16), (40, 16), (150, 64)])
@pytest.mark.parametrize("grouped", [True, False])
def test_the_chunked_form_gives_the_token_by_token_outputs_and_state(n_tok: int, chunk: int, grouped: bool) -> None:
    """gated_delta_net_chunked is the twin of a GPU prompt kernel: whole chunks as matrix products (decays
    summed over a 64-token chunk reach e^-128 here, which must underflow to 0, not overflow)."""
    q, k, v, g, beta, state = _inputs(np.random.default_rng(6 + n_tok), n_tok, dim=16)
    want_out, want_state = delta_net.gated_delta_net(q, k, v, g, beta, state, grouped, keep_states=False)
    got_out, got_state = delta_net.gated_delta_net_chunked(q, k, v, g, beta, state, grouped, chunk=chunk)
    np.testing.assert_allclose(got_out, want_out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got_state, want_state, rtol=1e-4, atol=1e-5)


def test_the_ops_never_write_the_state_they_are_given() -> None:
    """The sequence cache keeps earlier states by reference (engine/hybrid_cache.py)."""
    rng = np.random.default_rng(7)
    q, k, v, g, beta, state = _inputs(rng, 3)
    conv_state = rng.standard_normal((3, 6), dtype=np.float32)
    kept, kept_conv = state.copy(), conv_state.copy()
    delta_net.gated_delta_net(q, k, v, g, beta, state, True, keep_states=True)
    delta_net.gated_delta_net_chunked(q, k, v, g, beta, state, True)
    delta_net.ssm_conv(rng.standard_normal((4, 6), dtype=np.float32), conv_state, np.ones((6, 4), np.float32))
    np.testing.assert_array_equal(state, kept)
    np.testing.assert_array_equal(conv_state, kept_conv)
