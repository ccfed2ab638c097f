"""llama.cpp (through llama-cpp-python's low-level API) as the oracle: logits and greedy tokens for a GGUF.

Loaded on the CPU with `use_extra_bufts = False` (the repacked CPU buffer types crash on these
processors for quantized 2D weights, see DESIGN.md), flash attention off, and the K/V cache type the
runner uses (f16 by default, llama.cpp's; f32), so that differences from the runner come from the
weights' quantization alone.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp as L
import numpy as np

from runner.backends.kv_type import DEFAULT_KV_TYPE, check_kv_type
from runner.errors import ModelFileError

GGML_TYPES = {"f32": 0, "f16": 1}  # ggml_type of each K/V cache type


@L.llama_log_callback
def _quiet_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    return None


class LlamaOracle:
    def __init__(self, path: str | Path, n_ctx: int = 512, threads: int = 2, kv_type: str = DEFAULT_KV_TYPE):
        L.llama_log_set(_quiet_log, ctypes.c_void_p())
        L.llama_backend_init()
        params = L.llama_model_default_params()
        params.n_gpu_layers = 0
        params.use_extra_bufts = False
        self.model = L.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise ModelFileError(f"llama.cpp could not load {path}")
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.n_ctx = n_ctx
        self.threads = threads
        self.kv_type = check_kv_type(kv_type)

    def _context(self) -> L.llama_context_p:
        cp = L.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = self.n_ctx
        cp.n_threads = cp.n_threads_batch = self.threads
        cp.type_k = cp.type_v = GGML_TYPES[self.kv_type]
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        ctx = L.llama_init_from_model(self.model, cp)
        if not ctx:
            raise RuntimeError("llama.cpp could not create a context")
        return ctx

    def _decode(self, ctx: L.llama_context_p, tokens: list[int], start: int, want_all: bool) -> np.ndarray:
        n = len(tokens)
        batch = L.llama_batch_init(n, 0, 1)
        try:
            for i, tok in enumerate(tokens):
                batch.token[i] = tok
                batch.pos[i] = start + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = want_all or i == n - 1
            batch.n_tokens = n
            if L.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
            rows = range(n) if want_all else [n - 1]
            return np.stack([
                np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(self.n_vocab,)).copy() for i in rows
            ])
        finally:
            L.llama_batch_free(batch)

    def logits(self, tokens: list[int]) -> np.ndarray:
        """Logits [len(tokens), n_vocab] at every position of one batch."""
        ctx = self._context()
        try:
            return self._decode(ctx, tokens, 0, want_all=True)
        finally:
            L.llama_free(ctx)

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        """The greedy continuation of `prompt`, one token at a time (EOG tokens included, not stopped on)."""
        ctx = self._context()
        try:
            logits = self._decode(ctx, prompt, 0, want_all=False)[-1]
            out: list[int] = []
            for _ in range(n):
                token = int(np.argmax(logits))
                out.append(token)
                logits = self._decode(ctx, [token], len(prompt) + len(out) - 1, want_all=False)[-1]
            return out
        finally:
            L.llama_free(ctx)

    def close(self) -> None:
        if self.model:
            L.llama_model_free(self.model)
            self.model = None

    def __enter__(self) -> "LlamaOracle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
