"""The attention kernels (cuda/attention.cu) against NumpyOps.attention evaluated in float64.

Tolerance: atol 2e-6, rtol 0, with q, k, v standard normal (scaled scores ~ N(0, 1), outputs up to
~4 in magnitude). The kernels round every float32 step once (dot products as sequential FMAs, the
online softmax rescales, the chunk merge); a float32 emulation of the same algorithm and the twin
run in float32 both land within 3e-7 of float64 on these inputs, so 2e-6 leaves a 6x margin while
a wrong mask, a dropped key or a mis-merged chunk is off by 1e-2 or more. Float16 caches (the
default, --cache-type f16) are compared with the twin fed the same float16-rounded K/V (the rounding
is the cache's, not the kernel's), and with the kernels over a float32 cache holding those rounded
values, bit for bit: the kernels widen each half exactly, so the cache's type must change nothing
else. The large-score tests use integer q and k with D = 64, so scores (up to ~7000, which
would overflow a softmax that skips the max) are exact in float32 and the tolerance is the same.
Batch invariance is bitwise: a row computed alone equals the same row in a batch of up to 8.
Rows of the cache past n_kv hold NaN, so any read beyond the valid keys would show.
"""

from __future__ import annotations

import numpy as np
import pytest

from runner.backends.cuda.kernels import gpu_available
from runner.backends.numpy.ops import NumpyOps

pytestmark = pytest.mark.cuda
if not gpu_available():
    pytest.skip("needs an NVIDIA GPU with CuPy", allow_module_level=True)

import cupy as cp  # noqa: E402

from runner.backends.cuda import attention as attention_cuda  # noqa: E402
from runner.backends.limits import SMALL_BATCH_ROWS  # noqa: E402

ATOL = 2e-6
LAYOUTS = [(4, 4, 64), (8, 2, 128), (96, 8, 128), (16, 4, 64)]  # (H, Hkv, D)
DECODE_ROWS = [1, 2, 3, 4, 8]
DECODE_N_KV = [1, 5, 255, 256, 257, 1000, 4096]


@pytest.fixture(params=["tiles", "keys"])
def decode_split(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both decode split kernels (attention_cuda.DECODE_SPLIT) meet every decode test."""
    monkeypatch.setattr(attention_cuda, "DECODE_SPLIT", request.param)
    return request.param


def _cache(rng: np.random.Generator, n_kv: int, n_ctx: int, n_head_kv: int, head_dim: int,
           dtype=np.float32) -> tuple[np.ndarray, cp.ndarray]:
    """(host copy of the valid rows as float64, device cache [n_ctx, Hkv, D] with NaN past n_kv)."""
    valid = rng.standard_normal((n_kv, n_head_kv, head_dim)).astype(dtype)
    full = np.full((n_ctx, n_head_kv, head_dim), np.nan, dtype=dtype)
    full[:n_kv] = valid
    return valid.astype(np.float64), cp.asarray(full)


def _positions(n_rows: int, n_kv: int, where: str) -> np.ndarray:
    """Consecutive positions ending at the cache's end, or starting a third of the way in."""
    start = n_kv - n_rows if where == "end" else n_kv // 3
    return np.clip(np.arange(start, start + n_rows), 0, n_kv - 1).astype(np.int32)


def _check(n_rows: int, layout: tuple[int, int, int], n_kv: int, positions: np.ndarray, seed: int,
           kv_dtype=np.float32, n_ctx: int | None = None) -> None:
    """The float32 kernels (decode, and the prompt kernel's check path); tests/test_flash_attention_cuda.py
    covers the tensor-core prompt kernel."""
    n_head, n_head_kv, head_dim = layout
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n_rows, n_head, head_dim)).astype(np.float32)
    k64, k_dev = _cache(rng, n_kv, n_ctx or n_kv + 3, n_head_kv, head_dim, kv_dtype)
    v64, v_dev = _cache(rng, n_kv, n_ctx or n_kv + 3, n_head_kv, head_dim, kv_dtype)
    want = NumpyOps().attention(q.astype(np.float64), k64, v64, positions)
    got = attention_cuda.attention(cp.asarray(q), k_dev, v_dev, n_kv, cp.asarray(positions), precision="f32")
    assert got.dtype == cp.float32 and got.shape == (n_rows, n_head * head_dim)
    np.testing.assert_allclose(cp.asnumpy(got), want, rtol=0, atol=ATOL)


@pytest.mark.usefixtures("decode_split")
@pytest.mark.parametrize("where", ["end", "mid"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n_kv", DECODE_N_KV)
@pytest.mark.parametrize("n_rows", DECODE_ROWS)
def test_decode_matches_twin(n_rows: int, n_kv: int, layout: tuple[int, int, int], where: str) -> None:
    _check(n_rows, layout, n_kv, _positions(n_rows, n_kv, where), seed=n_rows * 7919 + n_kv)


PREFILL_CASES = [  # (T, n_kv, layout): n_kv == T is a whole prompt, larger n_kv a later micro-batch
    (9, 9, LAYOUTS[0]), (9, 257, LAYOUTS[1]), (9, 4096, LAYOUTS[2]), (9, 32768, LAYOUTS[1]),
    (64, 64, LAYOUTS[3]), (64, 1000, LAYOUTS[0]), (64, 257, LAYOUTS[2]), (64, 32768, LAYOUTS[0]),
    (130, 130, LAYOUTS[1]), (130, 1000, LAYOUTS[2]), (130, 4096, LAYOUTS[3]),
    (512, 512, LAYOUTS[0]), (512, 1000, LAYOUTS[1]), (512, 4096, LAYOUTS[3]),
]


@pytest.mark.parametrize("where", ["end", "mid"])
@pytest.mark.parametrize(("n_rows", "n_kv", "layout"), PREFILL_CASES)
def test_prefill_matches_twin(n_rows: int, n_kv: int, layout: tuple[int, int, int], where: str) -> None:
    _check(n_rows, layout, n_kv, _positions(n_rows, n_kv, where), seed=n_rows * 31 + n_kv)


@pytest.mark.parametrize("n_rows", [3, 8, 70])
def test_rows_in_any_order(n_rows: int) -> None:
    rng = np.random.default_rng(n_rows)
    positions = rng.choice(1000, size=n_rows, replace=False).astype(np.int32)
    _check(n_rows, LAYOUTS[1], 1000, positions, seed=n_rows + 1)


F16_LAYOUTS = [(4, 4, 64), (8, 2, 128), (96, 8, 128), (6, 2, 256), (6, 3, 256)]  # the three head-dim caps, GQA
F16_N_KV = [1, 31, 255, 257, 1000, 4097]  # short of and past a decode tile (32) and a split chunk (256)


@pytest.mark.usefixtures("decode_split")
@pytest.mark.parametrize("where", ["end", "mid"])
@pytest.mark.parametrize("layout", F16_LAYOUTS)
@pytest.mark.parametrize("n_kv", F16_N_KV)
@pytest.mark.parametrize("n_rows", [1, 3, 8])
def test_float16_cache_decode_matches_twin_on_rounded_kv(n_rows: int, n_kv: int, layout: tuple[int, int, int],
                                                         where: str) -> None:
    _check(n_rows, layout, n_kv, _positions(n_rows, n_kv, where), seed=n_rows + n_kv, kv_dtype=np.float16)


F16_PREFILL_CASES = [  # (T, n_kv, layout): T and n_kv off the 64-row and 64-key tiles of the check path
    (9, 9, F16_LAYOUTS[0]), (9, 4097, F16_LAYOUTS[1]), (70, 1000, F16_LAYOUTS[3]), (130, 257, F16_LAYOUTS[2]),
    (130, 130, F16_LAYOUTS[4]), (100, 4097, F16_LAYOUTS[1]), (512, 1000, (16, 4, 64)), (65, 65, F16_LAYOUTS[3]),
]


@pytest.mark.parametrize("where", ["end", "mid"])
@pytest.mark.parametrize(("n_rows", "n_kv", "layout"), F16_PREFILL_CASES)
def test_float16_cache_prefill_check_path_matches_twin_on_rounded_kv(n_rows: int, n_kv: int,
                                                                      layout: tuple[int, int, int], where: str) -> None:
    _check(n_rows, layout, n_kv, _positions(n_rows, n_kv, where), seed=n_rows * 3 + n_kv, kv_dtype=np.float16)


@pytest.mark.parametrize("head_dim", [32, 96, 160, 192])
@pytest.mark.parametrize("n_rows", [1, 5, 70])
def test_float16_cache_at_head_dims_below_their_cap(head_dim: int, n_rows: int) -> None:
    _check(n_rows, (6, 2, head_dim), 600, _positions(n_rows, 600, "mid"), seed=head_dim + n_rows, kv_dtype=np.float16)


@pytest.mark.usefixtures("decode_split")
@pytest.mark.parametrize("precision", ["f16", "f32"])
@pytest.mark.parametrize(("n_rows", "n_kv", "layout"), [(1, 257, F16_LAYOUTS[1]), (8, 1000, F16_LAYOUTS[2]),
                                                         (3, 31, F16_LAYOUTS[4]), (70, 1000, F16_LAYOUTS[3]),
                                                         (130, 4097, F16_LAYOUTS[1]), (200, 777, (6, 3, 256))])
def test_a_float16_cache_gives_the_bits_of_a_float32_cache_holding_its_values(
        n_rows: int, n_kv: int, layout: tuple[int, int, int], precision: str) -> None:
    """Every kernel (decode, the f32 check path, the tensor-core prompt kernel, which rounds a float32
    cache to fp16 itself) reads f16 K/V directly, with no other change; except that the prompt kernel up to
    head dim 128 walks an f16 cache in 64-key tiles (cp.async) and an f32 one in 32-key tiles (converted
    through registers), so its online softmax rescales at other steps: close, not the same bits."""
    n_head, n_head_kv, head_dim = layout
    rng = np.random.default_rng(n_rows * n_kv)
    q = cp.asarray(rng.standard_normal((n_rows, n_head, head_dim)).astype(np.float32))
    k, v = (rng.standard_normal((n_kv + 9, n_head_kv, head_dim)).astype(np.float16) for _ in range(2))
    positions = cp.asarray(_positions(n_rows, n_kv, "end"))
    half = attention_cuda.attention(q, cp.asarray(k), cp.asarray(v), n_kv, positions, precision=precision)
    full = attention_cuda.attention(q, cp.asarray(k.astype(np.float32)), cp.asarray(v.astype(np.float32)), n_kv,
                                    positions, precision=precision)
    tiles_differ = precision == "f16" and n_rows > SMALL_BATCH_ROWS and head_dim <= attention_cuda.FLASH_TILED_CAP
    if tiles_differ and attention_cuda.FLASH_F16_KEYS != attention_cuda.FLASH_F32_KEYS:
        cp.testing.assert_allclose(half, full, rtol=0, atol=5e-5)  # measured 8e-6 on outputs of ~0.03
    else:
        cp.testing.assert_array_equal(half, full)


@pytest.mark.usefixtures("decode_split")
@pytest.mark.parametrize("head_dim", [32, 96, 192, 256])
@pytest.mark.parametrize("n_rows", [1, 3, 70])
def test_other_head_dims(head_dim: int, n_rows: int) -> None:
    _check(n_rows, (6, 2, head_dim), 600, _positions(n_rows, 600, "mid"), seed=head_dim + n_rows)


def test_head_dims_sharing_a_kernel_in_any_order() -> None:
    """D = 96 and 128 (and 32 and 64) share compiled kernels; a smaller D first must not break a larger D."""
    for head_dim in (96, 128, 32, 64, 96, 128):
        for n_rows in (2, 20):
            _check(n_rows, (4, 2, head_dim), 300, _positions(n_rows, 300, "end"), seed=head_dim * n_rows)


@pytest.mark.usefixtures("decode_split")
@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("n_rows", [1, 4, 9, 100])
def test_large_scores_are_stable(n_rows: int, kv_dtype) -> None:
    """Integer q, k: exact scores up to ~7000 apart, so exp without the running max would overflow."""
    rng = np.random.default_rng(n_rows)
    n_head, n_head_kv, head_dim, n_kv = 8, 2, 64, 700
    q = rng.integers(-30, 31, size=(n_rows, n_head, head_dim)).astype(np.float32)
    k = rng.integers(-30, 31, size=(n_kv, n_head_kv, head_dim)).astype(kv_dtype)  # exact in f16 too
    k[::50] *= 0  # some keys score exactly 0, a tie every 50 keys for rows that see no larger score
    v = rng.standard_normal((n_kv, n_head_kv, head_dim)).astype(kv_dtype)
    positions = _positions(n_rows, n_kv, "mid")
    want = NumpyOps().attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), positions)
    got = cp.asnumpy(attention_cuda.attention(cp.asarray(q), cp.asarray(k), cp.asarray(v), n_kv, cp.asarray(positions),
                                              precision="f32"))
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)


@pytest.mark.usefixtures("decode_split")
@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
@pytest.mark.parametrize(("layout", "n_kv"), [(LAYOUTS[2], 4096), (LAYOUTS[3], 1000), (LAYOUTS[1], 300)])
def test_decode_rows_are_batch_invariant(layout: tuple[int, int, int], n_kv: int, kv_dtype) -> None:
    """Each row of a 1..8-row batch is bit-identical to the row alone, and to the row against a longer n_kv."""
    n_head, n_head_kv, head_dim = layout
    rng = np.random.default_rng(n_kv)
    n_ctx = n_kv + 700
    q = cp.asarray(rng.standard_normal((8, n_head, head_dim)).astype(np.float32))
    k = cp.asarray(rng.standard_normal((n_ctx, n_head_kv, head_dim)).astype(kv_dtype))
    v = cp.asarray(rng.standard_normal((n_ctx, n_head_kv, head_dim)).astype(kv_dtype))
    verify = np.arange(n_kv - 8, n_kv, dtype=np.int32)  # a speculative verify batch at the cache's end
    scattered = np.sort(rng.choice(n_kv, size=8, replace=False)).astype(np.int32)
    for positions in (verify, scattered):
        alone = [attention_cuda.attention(q[t:t + 1], k, v, n_kv, cp.asarray(positions[t:t + 1])) for t in range(8)]
        for t in range(8):  # graph replays pass the whole buffer as n_kv
            longer = attention_cuda.attention(q[t:t + 1], k, v, n_ctx, cp.asarray(positions[t:t + 1]))
            cp.testing.assert_array_equal(longer, alone[t])
        for n_rows in range(2, 9):
            batch = attention_cuda.attention(q[:n_rows], k, v, n_kv, cp.asarray(positions[:n_rows]))
            for t in range(n_rows):
                cp.testing.assert_array_equal(batch[t:t + 1], alone[t])


@pytest.mark.usefixtures("decode_split")
@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("layout", [LAYOUTS[2], LAYOUTS[3], LAYOUTS[1]])
def test_decode_bits_do_not_depend_on_pairs_per_warp(layout: tuple[int, int, int], kv_dtype,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """DEC_SLOTS only changes which warp serves a (row, head) pair: 1, 2 and 4 give the same bits."""
    n_head, n_head_kv, head_dim = layout
    rng = np.random.default_rng(head_dim)
    n_kv = 1000
    q = cp.asarray(rng.standard_normal((8, n_head, head_dim)).astype(np.float32))
    k = cp.asarray(rng.standard_normal((n_kv + 5, n_head_kv, head_dim)).astype(kv_dtype))
    v = cp.asarray(rng.standard_normal((n_kv + 5, n_head_kv, head_dim)).astype(kv_dtype))
    got = {}
    for slots in (4, 2, 1):
        monkeypatch.setattr(attention_cuda, "DEC_SLOTS", slots)
        for n_rows in (1, 3, 8):
            positions = cp.asarray(np.arange(n_kv - n_rows, n_kv, dtype=np.int32))
            got[slots, n_rows] = attention_cuda.attention(q[:n_rows], k, v, n_kv, positions)
    for (slots, n_rows), out in got.items():
        cp.testing.assert_array_equal(out, got[4, n_rows])


@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
@pytest.mark.parametrize("layout", [LAYOUTS[2], LAYOUTS[3], LAYOUTS[1], (16, 4, 256), (16, 4, 96)])
def test_decode_bits_do_not_depend_on_loads_in_flight(layout: tuple[int, int, int], kv_dtype,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """DEC_K_AHEAD and DEC_V_AHEAD (the keys split's loads issued before their first use) move loads, never a
    rounding: every schedule gives the bits of one load at a time, at tile edges (n_kv 1000: a last tile of 8
    keys) and at head dims that are not a multiple of the 64 dims that 16 loads cover (96)."""
    n_head, n_head_kv, head_dim = layout
    monkeypatch.setattr(attention_cuda, "DECODE_SPLIT", "keys")
    rng = np.random.default_rng(head_dim + 1)
    n_kv = 1000
    q = cp.asarray(rng.standard_normal((8, n_head, head_dim)).astype(np.float32))
    k = cp.asarray(rng.standard_normal((n_kv + 5, n_head_kv, head_dim)).astype(kv_dtype))
    v = cp.asarray(rng.standard_normal((n_kv + 5, n_head_kv, head_dim)).astype(kv_dtype))
    got = {}
    for ahead in ((1, 1), (16, 8), (4, 3)):  # 3 keys: V's last round of a 32-key tile is partial
        monkeypatch.setattr(attention_cuda, "DEC_K_AHEAD", ahead[0])
        monkeypatch.setattr(attention_cuda, "DEC_V_AHEAD", ahead[1])
        for n_rows in (1, 3, 8):
            positions = cp.asarray(np.arange(n_kv - n_rows, n_kv, dtype=np.int32))
            got[ahead, n_rows] = attention_cuda.attention(q[:n_rows], k, v, n_kv, positions)
    for (ahead, n_rows), out in got.items():
        cp.testing.assert_array_equal(out, got[(1, 1), n_rows])


@pytest.mark.parametrize("kv_dtype", [np.float32, np.float16])
def test_decode_replays_in_a_graph_as_it_runs_eagerly(kv_dtype, decode_split: str) -> None:
    """A captured decode launch replayed at moving positions (as a decode graph does, the whole buffer as n_kv)
    gives the eager launch's bits every time, with launches of other shapes between."""
    n_head, n_head_kv, head_dim = LAYOUTS[3]
    rng = np.random.default_rng(23)
    n_ctx = 3000
    q = cp.asarray(rng.standard_normal((1, n_head, head_dim)).astype(np.float32))
    k = cp.asarray(rng.standard_normal((n_ctx, n_head_kv, head_dim)).astype(kv_dtype))
    v = cp.asarray(rng.standard_normal((n_ctx, n_head_kv, head_dim)).astype(kv_dtype))
    position = cp.zeros(1, dtype=cp.int32)
    out = cp.empty((1, n_head * head_dim), dtype=cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        attention_cuda.attention(q, k, v, n_ctx, position, out=out, check_positions=False)  # compiles, counters
        stream.begin_capture()
        attention_cuda.attention(q, k, v, n_ctx, position, out=out, check_positions=False)
        graph = stream.end_capture()
        for at in (0, 127, 128, 129, 1000, 2999, 5, 2048):
            position[...] = at
            graph.launch(stream=stream)
            replayed = out.copy()
            eager = attention_cuda.attention(q, k, v, n_ctx, position, check_positions=False)
            half = [cp.ascontiguousarray(a[:, : a.shape[1] // 2]) for a in (q, k, v)]
            other = attention_cuda.attention(*half, n_ctx, position, check_positions=False)  # another grid between
            assert bool(cp.isfinite(other).all())
            cp.testing.assert_array_equal(replayed, eager)
    stream.synchronize()


def test_out_buffer_is_filled_and_returned() -> None:
    rng = np.random.default_rng(0)
    q = cp.asarray(rng.standard_normal((2, 8, 64)).astype(np.float32))
    k = cp.asarray(rng.standard_normal((50, 2, 64)).astype(np.float32))
    positions = cp.asarray(np.array([10, 11], dtype=np.int32))
    out = cp.full((2, 8 * 64), cp.nan, dtype=cp.float32)
    got = attention_cuda.attention(q, k, k, 12, positions, out=out)
    assert got is out
    cp.testing.assert_array_equal(out, attention_cuda.attention(q, k, k, 12, positions))


def test_wrapper_rejects_bad_inputs() -> None:
    q = cp.ones((2, 8, 64), dtype=cp.float32)
    k = cp.ones((16, 2, 64), dtype=cp.float32)
    pos = cp.asarray(np.array([3, 4], dtype=np.int32))
    with pytest.raises(AssertionError, match="q must be cupy float32"):
        attention_cuda.attention(q.astype(cp.float64), k, k, 8, pos)
    with pytest.raises(AssertionError, match="float32 or float16"):
        attention_cuda.attention(q, k.astype(cp.float64), k.astype(cp.float64), 8, pos)
    with pytest.raises(AssertionError, match="differ in dtype"):
        attention_cuda.attention(q, k, k.astype(cp.float16), 8, pos)
    with pytest.raises(AssertionError, match="cache head dim 32"):
        k32 = cp.ones((16, 2, 32), cp.float32)
        attention_cuda.attention(q, k32, k32, 8, pos)
    with pytest.raises(AssertionError, match="multiple of Hkv"):
        attention_cuda.attention(q, cp.ones((16, 3, 64), cp.float32), cp.ones((16, 3, 64), cp.float32), 8, pos)
    with pytest.raises(AssertionError, match="multiple of 32"):
        q48, k48 = cp.ones((2, 8, 48), cp.float32), cp.ones((16, 2, 48), cp.float32)
        attention_cuda.attention(q48, k48, k48, 8, pos)
    with pytest.raises(AssertionError, match="int32"):
        attention_cuda.attention(q, k, k, 8, pos.astype(cp.int64))
    with pytest.raises(AssertionError, match=r"shape \(1,\)"):
        attention_cuda.attention(q, k, k, 8, pos[:1])
    with pytest.raises(AssertionError, match="only keys 0..7"):
        attention_cuda.attention(q, k, k, 8, cp.asarray(np.array([3, 8], dtype=np.int32)))
    with pytest.raises(AssertionError, match="span"):
        attention_cuda.attention(q, k, k, 8, cp.asarray(np.array([-1, 4], dtype=np.int32)))
    with pytest.raises(AssertionError, match="n_kv 17"):
        attention_cuda.attention(q, k, k, 17, pos)
    with pytest.raises(AssertionError, match="out shape"):
        attention_cuda.attention(q, k, k, 8, pos, out=cp.empty((2, 64), cp.float32))
