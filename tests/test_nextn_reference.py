"""The glm4moe NextN (MTP) block against an independent float64 transcription of llama.cpp's graph_mtp.

The reference below reads the GGUF with `gguf.GGUFReader` + `gguf.quants.dequantize` only (none of
runner's ops, weights or KV cache classes) and follows the published DeepSeek-V3 / GLM-4.5 MTP layer
as llama.cpp builds it (src/models/glm4-moe.cpp, graph_mtp, and build_moe_ffn):

    e   = rmsnorm(embed_tokens[t], enorm)          hn = rmsnorm(h, hnorm)
    x   = eh_proj @ concat(e, hn)
    x   = x + attn(rmsnorm(x, attn_norm))           (q/k/v bias, partial NEOX rope, GQA, causal)
    y   = rmsnorm(x, post_attention_norm)
    x   = x + moe(y) + shared_expert(y)             (sigmoid probs, +exp_probs_b for selection only,
                                                     top-k, renormalised, * expert_weights_scale)
    out = rmsnorm(x, shared_head_norm)              logits = shared_head_head @ out

The runner computes in float32 and the reference in float64, hence the tolerances below.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize

from runner.backends.numpy.ops import NumpyOps
from runner.engine.engine import Engine, EngineConfig
from runner.gguf_file import open_gguf

ARCH = "glm4moe"
# float32 runner vs float64 reference: logits have std ~4, hidden states rms ~1.
RTOL, ATOL = 1e-4, 1e-3
SEQ = np.array([17, 301, 5, 444, 88, 250])  # tokens at p+1 for positions p = 0..5


# -- the reference ------------------------------------------------------------------------------
class ReferenceMTP:
    """A float64 transcription of the MTP layer, one token at a time, with its own list-based KV cache."""

    def __init__(self, path: Path):
        reader = GGUFReader(path, "r")
        meta = {f.name: f.contents() for f in reader.fields.values()}
        tensors = {t.name: t for t in reader.tensors}

        def key(name: str, default: object = None) -> object:
            return meta.get(f"{ARCH}.{name}", default)

        def tensor(name: str) -> np.ndarray:
            t = tensors[name]
            values = dequantize(t.data, t.tensor_type).astype(np.float64)
            return values.reshape(tuple(int(n) for n in reversed(t.shape.tolist())))  # numpy order

        block_count = int(key("block_count"))
        assert int(key("nextn_predict_layers", 0)) == 1
        L = block_count - 1
        self.n_head = int(key("attention.head_count"))
        self.n_head_kv = int(key("attention.head_count_kv"))
        self.head_dim = int(key("attention.key_length"))
        self.n_rot = int(key("rope.dimension_count"))
        self.rope_base = float(key("rope.freq_base"))
        self.eps = float(key("attention.layer_norm_rms_epsilon"))
        self.top_k = int(key("expert_used_count"))
        self.w_scale = float(key("expert_weights_scale", 0.0))
        self.w_norm = bool(key("expert_weights_norm", False))

        p, n = f"blk.{L}.", f"blk.{L}.nextn."
        self.embed = tensor(n + "embed_tokens.weight")  # [vocab, d]
        self.enorm = tensor(n + "enorm.weight")
        self.hnorm = tensor(n + "hnorm.weight")
        self.eh_proj = tensor(n + "eh_proj.weight")  # [d, 2d]
        self.head_norm = tensor(n + "shared_head_norm.weight")
        self.head = tensor(n + "shared_head_head.weight")  # [vocab, d]
        self.attn_norm = tensor(p + "attn_norm.weight")
        self.wq, self.bq = tensor(p + "attn_q.weight"), tensor(p + "attn_q.bias")
        self.wk, self.bk = tensor(p + "attn_k.weight"), tensor(p + "attn_k.bias")
        self.wv, self.bv = tensor(p + "attn_v.weight"), tensor(p + "attn_v.bias")
        self.wo = tensor(p + "attn_output.weight")
        self.post_norm = tensor(p + "post_attention_norm.weight")
        self.router = tensor(p + "ffn_gate_inp.weight")  # [n_expert, d]
        self.probs_b = tensor(p + "exp_probs_b.bias")  # [n_expert]
        self.gate_exps = tensor(p + "ffn_gate_exps.weight")  # [n_expert, f, d]
        self.up_exps = tensor(p + "ffn_up_exps.weight")
        self.down_exps = tensor(p + "ffn_down_exps.weight")  # [n_expert, d, f]
        self.gate_sh = tensor(p + "ffn_gate_shexp.weight")
        self.up_sh = tensor(p + "ffn_up_shexp.weight")
        self.down_sh = tensor(p + "ffn_down_shexp.weight")
        self.keys: list[np.ndarray] = []  # per position: [n_head_kv, head_dim], after rope
        self.values: list[np.ndarray] = []
        self.min_topk_margin = np.inf  # smallest gap between the k-th and (k+1)-th selection score seen

    # small pieces
    def rms(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x) + self.eps) * w

    @staticmethod
    def silu(x: np.ndarray) -> np.ndarray:
        return x / (1.0 + np.exp(-x))

    def rope(self, v: np.ndarray, pos: int) -> np.ndarray:
        """NEOX rotary on the first n_rot dims of one head: dim i pairs with i + n_rot/2."""
        out = v.copy()
        half = self.n_rot // 2
        for i in range(half):
            theta = pos * self.rope_base ** (-2.0 * i / self.n_rot)
            a, b = v[i], v[i + half]
            out[i] = a * np.cos(theta) - b * np.sin(theta)
            out[i + half] = a * np.sin(theta) + b * np.cos(theta)
        return out

    def attention(self, x: np.ndarray, pos: int) -> np.ndarray:
        hd = self.head_dim
        h = self.rms(x, self.attn_norm)
        q = (self.wq @ h + self.bq).reshape(self.n_head, hd)
        k = (self.wk @ h + self.bk).reshape(self.n_head_kv, hd)
        v = (self.wv @ h + self.bv).reshape(self.n_head_kv, hd)
        assert len(self.keys) == pos
        self.keys.append(np.stack([self.rope(k[j], pos) for j in range(self.n_head_kv)]))
        self.values.append(v)
        group = self.n_head // self.n_head_kv
        heads = []
        for hh in range(self.n_head):
            qh = self.rope(q[hh], pos)
            kv_head = hh // group
            scores = np.array([qh @ self.keys[s][kv_head] for s in range(pos + 1)]) / np.sqrt(hd)
            probs = np.exp(scores - scores.max())
            probs /= probs.sum()
            heads.append(sum(probs[s] * self.values[s][kv_head] for s in range(pos + 1)))
        return self.wo @ np.concatenate(heads)

    def moe(self, y: np.ndarray) -> np.ndarray:
        probs = 1.0 / (1.0 + np.exp(-(self.router @ y)))  # sigmoid gating
        selection = probs + self.probs_b  # the bias picks experts but does not weight them
        order = np.argsort(-selection, kind="stable")
        self.min_topk_margin = min(self.min_topk_margin, selection[order[self.top_k - 1]] - selection[order[self.top_k]])
        chosen = order[: self.top_k]
        weights = probs[chosen]
        if self.w_norm:
            weights = weights / max(weights.sum(), 6.103515625e-5)
        if self.w_scale not in (0.0, 1.0):
            weights = weights * self.w_scale
        out = np.zeros_like(y)
        for expert, weight in zip(chosen, weights):
            act = self.silu(self.gate_exps[expert] @ y) * (self.up_exps[expert] @ y)
            out += weight * (self.down_exps[expert] @ act)
        shared = self.down_sh @ (self.silu(self.gate_sh @ y) * (self.up_sh @ y))
        return out + shared

    def step(self, hidden: np.ndarray, token: int) -> tuple[np.ndarray, np.ndarray]:
        """One position: the trunk's normed hidden at p and the token at p+1 -> logits, out_hidden."""
        pos = len(self.keys)
        e = self.rms(self.embed[token], self.enorm)
        hn = self.rms(hidden, self.hnorm)
        x = self.eh_proj @ np.concatenate([e, hn])
        x = x + self.attention(x, pos)
        x = x + self.moe(self.rms(x, self.post_norm))
        out = self.rms(x, self.head_norm)
        return self.head @ out, out

    def forward(self, hidden: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        results = [self.step(np.asarray(hidden[i], dtype=np.float64), int(tokens[i])) for i in range(len(tokens))]
        return np.stack([r[0] for r in results]), np.stack([r[1] for r in results])


# -- fixtures -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def glm_path(synth_model) -> Path:
    return synth_model(ARCH, "F32", "tiny", 0)


@pytest.fixture(scope="module")
def block(glm_path: Path):
    # float32 throughout, K/V included: the transcription rounds nothing to f16
    engine = Engine(open_gguf(glm_path), EngineConfig(), ops=NumpyOps(llama_activations=False, kv_type="f32"))
    assert len(engine.nextn) == 1
    return engine.nextn[0]


def _hidden(n: int, d: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


def _host(block, x) -> np.ndarray:
    return np.asarray(block.ops.to_host(x), dtype=np.float64)


# -- tests --------------------------------------------------------------------------------------
def test_block_matches_reference_transcription(block, glm_path: Path) -> None:
    ref = ReferenceMTP(glm_path)
    hidden = _hidden(len(SEQ), block.cfg.n_embd)
    logits, out_hidden = block.forward(hidden, SEQ, block.new_kv_cache(64))
    ref_logits, ref_hidden = ref.forward(hidden, SEQ)
    # Routing is discrete: a near-tie would make float32 and float64 legitimately pick different experts.
    assert ref.min_topk_margin > 1e-4, f"top-k near tie ({ref.min_topk_margin:.2e}); pick another sequence"
    assert _host(block, logits).shape == (len(SEQ), block.cfg.n_vocab)
    np.testing.assert_allclose(_host(block, out_hidden), ref_hidden, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(_host(block, logits), ref_logits, rtol=RTOL, atol=ATOL)
    assert np.array_equal(_host(block, logits).argmax(-1), ref_logits.argmax(-1))


def test_incremental_equals_batch(block) -> None:
    hidden = _hidden(len(SEQ), block.cfg.n_embd)
    batch_logits, batch_hidden = block.forward(hidden, SEQ, block.new_kv_cache(64))
    kv = block.new_kv_cache(64)
    steps = [block.forward(hidden[i : i + 1], SEQ[i : i + 1], kv) for i in range(len(SEQ))]
    assert kv.n_tokens == len(SEQ)
    np.testing.assert_allclose(np.concatenate([_host(block, s[0]) for s in steps]), _host(block, batch_logits),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.concatenate([_host(block, s[1]) for s in steps]), _host(block, batch_hidden),
                               rtol=1e-4, atol=1e-4)


def test_recursive_drafting_matches_reference(block, glm_path: Path) -> None:
    """Prefill the MTP cache with a few positions, then draft 3 tokens feeding each returned hidden back."""
    ref = ReferenceMTP(glm_path)
    prefix = SEQ[:4]
    hidden = _hidden(len(prefix), block.cfg.n_embd, seed=2)
    kv = block.new_kv_cache(64)
    logits, h = block.forward(hidden, prefix, kv)
    ref_logits, ref_h = ref.forward(hidden, prefix)
    np.testing.assert_allclose(_host(block, logits), ref_logits, rtol=RTOL, atol=ATOL)
    h, ref_h, token = h[-1:], ref_h[-1], int(ref_logits[-1].argmax())
    for step in range(3):
        assert int(_host(block, logits)[-1].argmax()) == token, f"draft {step}: runner drafted another token"
        logits, h = block.forward(h, np.array([token]), kv)  # the block's own hidden goes back in
        ref_logits, ref_h = ref.step(ref_h, token)
        np.testing.assert_allclose(_host(block, h)[0], ref_h, rtol=RTOL, atol=ATOL, err_msg=f"draft step {step}")
        np.testing.assert_allclose(_host(block, logits)[0], ref_logits, rtol=RTOL, atol=ATOL,
                                   err_msg=f"draft step {step}")
        token = int(ref_logits.argmax())
    assert kv.n_tokens == len(prefix) + 3 == len(ref.keys)
    assert ref.min_topk_margin > 1e-4, f"top-k near tie ({ref.min_topk_margin:.2e})"


def test_model_without_nextn_has_no_block(synth_model) -> None:
    engine = Engine.load(synth_model("qwen3moe", "F32", "tiny", 0))
    assert engine.nextn == []
    assert engine.model_config.n_nextn == 0
