"""The engine: load a GGUF model, prefill a prompt in micro-batches, decode and sample, stop."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from runner.backends.numpy.ops import NumpyOps
from runner.backends.numpy.split_devices import EmulatedDevices, SplitModel
from runner.backends.step import Step
from runner.engine.generation import (Generation, GenerationRequest, TokenSource, chained_greedy_tokens, fit_to_context,
                                      generation_loop, greedy_tokens, is_plain_greedy, is_plain_top_k, plain_tokens,
                                      top_k_tokens)
from runner.engine.prompt_cache import Entry, PromptCache
from runner.engine.sampling import NON_FINITE, NonFiniteLogits, SamplingParams
from runner.engine.sequence_cache import SequenceCache
from runner.engine.tokenizer import Tokenizer
from runner.errors import GenerationError
from runner.gguf_file import GGUFFile, open_gguf
from runner.launch.devices import SplitConfig
from runner.models import nextn_for, trunk_for
from runner.models.config import ModelConfig, model_config
from runner.models.weights import is_routed_expert, load_weights
from runner.offload.backend import backend_for
from runner.offload.offload import ExpertOffload, OffloadConfig
from runner.offload.prefill_stream import PromptTail
from runner.spec.config import DraftConfig, check_draft_support
from runner.spec.depth import DepthPolicy
from runner.spec.drafter import MTPDrafter
from runner.spec.stats import DraftStats
from runner.spec.verify import speculative_tokens


@dataclass(frozen=True)
class EngineConfig:
    n_ctx: int = 4096
    ubatch: int = 512  # prompt tokens per forward pass
    offload: OffloadConfig | None = None  # routed experts behind a slot cache; None: all resident
    prompt_cache_bytes: int = 0  # host RAM for other sequences' states (engine/prompt_cache.py); 0: none
    split: SplitConfig | None = None  # layers split across cards (--devices 0,1); numpy: emulated cards

    def __post_init__(self) -> None:
        if self.n_ctx < 1 or self.ubatch < 1:
            raise GenerationError(f"n_ctx ({self.n_ctx}) and ubatch ({self.ubatch}) must be positive")
        if self.prompt_cache_bytes < 0:
            raise GenerationError(f"the prompt cache size must be >= 0 bytes, got {self.prompt_cache_bytes}")


class Engine:
    """A single sequence on one model: keeps its KV cache between requests to reuse a shared prefix."""

    LOAD_STEPS = ("config", "weights", "tokenizer")
    # Plain greedy requests (generation.is_plain_greedy) take each decoded token from the backend's argmax instead
    # of downloading the logits row (600 KB a token at a 151552-token vocabulary) and choosing on the host: the
    # same tokens. seed48 offloaded on an H100: host time a token 0.53 -> 0.40 ms (median of 6 runs), 116.3 ->
    # 119.4 tok/s (docs/perf/2026-12-07e-seed48-fused-greedy-h100.md).
    GREEDY_ON_DEVICE = True
    # ...and one step ahead of the host (generation.chained_greedy_tokens): the step choosing token t + 1 is
    # enqueued, reading its input where step t chose it, before the host waits for token t, so the host's 0.4 to
    # 0.6 ms a token (seed48 offloaded on an H100) overlaps the GPU's step. The same tokens. seed48 offloaded on an
    # H100, 6 runs an arm: host 0.29 -> 0.15 ms a token, 132.5 -> 136.0 tok/s
    # (docs/perf/2026-12-07h-seed48-pdl-split-ahead-h100.md). A consumer that stops early leaves the step in flight
    # fed: the next turn reuses that token too. Measurements split prompt from decode at Generation.on_prefilled.
    GREEDY_AHEAD = True
    # Sampled requests whose chain starts with top-k (the default: top_k 40) take each decoded token's k best
    # (id, logit) pairs from the backend (Ops.top_k, cuda/top_k.cu) instead of the 600 KB row, and draw from them
    # on the host with the request's own generator: the same tokens, seed for seed. The host's sampler took
    # 0.32 ms a token on a 151552-token row (this CPU), the row's download more. Off until the kernel has run on
    # a GPU (docs/wip/gpu-call-36.sh).
    TOP_K_ON_DEVICE = False
    # Plain greedy requests with MTP drafting choose each draft and each verify row's token by the backend's argmax
    # (Ops.greedy_token, greedy_rows) instead of downloading every row and choosing on the host: the same tokens.
    # 07i's seed48 draft step cost 1.0 ms (0.15 of a decode step) for one layer and the LM head, about what seed8's
    # did (07f): a fixed cost, much of it the 600 KB row's download and the host's pick over 151552 values. Off
    # until a GPU has run it (docs/wip/gpu-call-47.sh).
    MTP_GREEDY_ON_DEVICE = False

    def __init__(self, model_file: GGUFFile, config: EngineConfig, ops: Any | None = None,
                 progress: Callable[[str], None] | None = None, experts: Any = None,
                 chat_template: str | None = None, arena_progress: Callable[[int, int], None] | None = None):
        """`chat_template`: a jinja template used instead of the file's tokenizer.chat_template (None: the file's).
        `arena_progress(done, total)`: bytes of the host expert arena filled so far, under expert offload."""
        report = progress or (lambda step: None)
        self.file = model_file
        self.config = config
        self.model_config: ModelConfig = model_config(model_file)
        report("config")
        self.ops = ops or NumpyOps()
        weights = load_weights(model_file, self.model_config)
        tensors = weights.all_tensors()
        on_host = frozenset(t.name for t in tensors if is_routed_expert(t.name)) if config.offload else frozenset()
        self.model = trunk_for(self.model_config, weights, self.ops)  # first: refuses a backend that cannot run it
        self.nextn = [nextn_for(self.model_config, w, self.ops) for w in weights.nextn]
        self.ops.check_weights(tensors, keep_on_host=on_host)
        report("weights")
        if chat_template is None:
            chat_template = model_file.get("tokenizer.chat_template")
        self.tokenizer = Tokenizer(model_file.path, chat_template)
        report("tokenizer")
        self.n_ctx = min(config.n_ctx, self.model_config.n_ctx_train)
        self.kv: SequenceCache = self.model.new_kv_cache(self.n_ctx)
        self.kv_tokens: list[int] = []  # the token ids whose K/V the cache holds, in order
        self.offload: ExpertOffload | None = None
        self.devices: EmulatedDevices | None = None
        if config.split is not None:
            self.model, self.devices = self._split(config.split)
        # What every forward of this engine runs under: where routed experts come from (`experts`, an
        # ExpertProvider, or expert offload's; None: the backend's resident copies).
        self.step = Step(experts=experts)
        if config.offload is not None:  # after the KV cache, so `--cache-slots auto` sees it reserved
            if experts is not None:
                raise GenerationError("an engine takes its routed experts from expert offload or from `experts`, "
                                      "not both")
            backend = backend_for(self.ops, self.model_config, weights, self.n_ctx, config.offload.vram_budget_bytes,
                                  config.offload.decode_batch)
            self.offload = ExpertOffload(self.model, config.offload, self.n_ctx, backend, arena_progress)
            self.step = Step(experts=self.offload)
        self.drafter: MTPDrafter | None = None  # made on the first generation with --draft mtp
        self._draft_policy: DepthPolicy | None = None
        self._draft_totals = DraftStats()
        self.prompt_cache = PromptCache(config.prompt_cache_bytes) if config.prompt_cache_bytes else None
        self._prompt_end = 0  # the last prompt's length: a request whose prompt lacks it leaves this sequence

    @classmethod
    def load(cls, path: str | Path, config: EngineConfig | None = None,
             progress: Callable[[str], None] | None = None, ops: Any | None = None, experts: Any = None,
             arena_progress: Callable[[int, int], None] | None = None) -> "Engine":
        """Open and check `path`; `progress` hears "open" and then each of LOAD_STEPS as it completes."""
        f = open_gguf(path)
        if progress:
            progress("open")
        return cls(f, config or EngineConfig(), ops, progress, experts, arena_progress=arena_progress)

    def _split(self, split: SplitConfig) -> tuple[SplitModel, EmulatedDevices]:
        """The trunk across emulated cards (numpy only: CudaOps has one device, see docs/ARCHITECTURE.md)."""
        if not isinstance(self.ops, NumpyOps):
            raise GenerationError(f"--devices {','.join(map(str, split.devices))}: more than one card is planned on "
                                  f"the cuda backend, not built yet; run on one device")
        if self.config.offload is not None:
            raise GenerationError("a split engine accounts its expert slots per card itself; give no offload config")
        if split.kv_type != self.ops.kv_type:
            raise GenerationError(f"the split was planned for K/V cached as {split.kv_type}, but the backend "
                                  f"stores {self.ops.kv_type}")
        plan, costs = split.plan(self.file, self.model_config, self.n_ctx)
        if self.config.ubatch > split.rows:
            raise GenerationError(f"a micro-batch of {self.config.ubatch} rows is more than the {split.rows} the "
                                  f"split's receive buffers hold")
        devices = EmulatedDevices(plan, costs, self.model_config.n_embd, split.receive_rows)
        return SplitModel(self.model, devices), devices

    # -- forward passes ---------------------------------------------------------------------------
    def prefill(self, tokens: list[int], cancelled: Callable[[], bool] | None = None,
                on_hidden: Callable[[int, Any], None] | None = None,
                tail: PromptTail | None = None) -> np.ndarray | None:
        """Bring the cache to hold `tokens` (reusing the longest cached prefix); logits after the last one.

        `cancelled` is asked between micro-batches; when it says yes, prefill stops there (the cache
        keeps the chunks already done, so a later request reuses them) and returns None.
        `on_hidden(start, hidden)` gets each chunk's final normed hidden rows, from position `start`
        (MTP drafting feeds them to the NextN block); under expert offload `tail` runs inside the
        prefill phase after the prompt (the NextN block's catch-up, its experts streamed).
        """
        if not tokens:
            raise GenerationError("the prompt is empty")
        self._prompt_end = len(tokens)
        reuse = self.kv.reachable(_common_prefix(self.kv_tokens, tokens, limit=len(tokens) - 1))
        self.rollback(reuse)
        if self.offload is not None:
            logits = self._prefill_offloaded(tokens[reuse:], reuse, cancelled, on_hidden, tail)
        else:
            logits = self._prefill_resident(tokens, reuse, cancelled, on_hidden)
        if logits is not None:
            self.kv.checkpoint()  # a later prompt that extends this one reuses it whole
        return logits

    def _prefill_resident(self, tokens: list[int], reuse: int, cancelled: Callable[[], bool] | None,
                          on_hidden: Callable[[int, Any], None] | None) -> np.ndarray | None:
        logits = None
        for start in range(reuse, len(tokens), self.config.ubatch):
            if cancelled is not None and cancelled():
                return None
            chunk = tokens[start : start + self.config.ubatch]
            logits, hidden = self.model.forward(np.asarray(chunk), self.kv, step=self.step)
            self.kv_tokens.extend(chunk)
            if on_hidden is not None:
                on_hidden(start, hidden)
        return self.ops.to_host(logits)[-1]

    def _prefill_offloaded(self, new: list[int], start: int, cancelled: Callable[[], bool] | None,
                           on_hidden: Callable[[int, Any], None] | None = None,
                           tail: PromptTail | None = None) -> np.ndarray | None:
        """The prompt streamed under the phase transaction (or, when it does not pay, through the cache)."""
        assert self.offload is not None

        def done(offset: int, chunk: list[int], hidden: Any) -> None:
            self.kv_tokens.extend(chunk)
            if on_hidden is not None:
                on_hidden(start + offset, hidden)

        out = self.offload.prefill(new, self.kv, self.config.ubatch, cancelled, done, tail=tail)
        return None if out is None else self.ops.to_host(out[-1][0])[-1]

    def decode(self, token: int) -> np.ndarray:
        return self._decode_step(token, lambda logits: self.ops.to_host(logits)[-1])

    def decode_greedy(self, token: int) -> int:
        """decode(), then the argmax of its logits chosen by the backend (the row stays where it is)."""
        chosen = self._decode_step(token, lambda logits: self.ops.greedy_token(logits[-1]))
        if chosen is None:
            raise NonFiniteLogits(NON_FINITE)
        return chosen

    def decode_top_k(self, token: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """decode(), then the k best (ids, logits) of its logits chosen by the backend (Ops.top_k)."""
        chosen = self._decode_step(token, lambda logits: self.ops.top_k(logits[-1], k))
        if chosen is None:
            raise NonFiniteLogits(NON_FINITE)
        return chosen

    def _decode_step(self, token: int, take: Callable[[Any], Any]) -> Any:
        """One token through the model, then take(logits), which waits for the step, so the time noted is the
        step's."""
        t0 = time.perf_counter()
        logits, _ = self.ops.decode_forward(self.model, token, self.kv, self.step)
        self.kv_tokens.append(token)
        out = take(logits)
        if self.offload is not None:
            self.offload.note_decode_step(time.perf_counter() - t0)
        return out

    def _greedy_chain(self) -> Any:
        """The backend's chain of greedy decode steps on this engine's cache (chained_greedy_tokens)."""
        chain = self.ops.greedy_chain(self.model, self.kv, self.step)
        return chain if self.offload is None else _TimedChain(chain, self.offload.note_decode_step)

    def _settle_chain(self) -> None:
        """After a chain: drop the positions past the tokens it named (a step that read a non-finite step's choice)."""
        if self.kv.n_tokens > len(self.kv_tokens):
            self.rollback(len(self.kv_tokens))

    def verify(self, tokens: list[int]) -> tuple[np.ndarray, Any]:
        """A pending token and its drafts in one batch: every row's logits (host) and trunk hidden rows.

        Row i equals what decode() would give for tokens[i] after tokens[:i] (batch invariance).
        A single token (depth 0: drafting does not pay) is a decode step, replayed from the decode
        graph where the backend has one, so adaptive drafting at depth 0 costs what plain decoding
        does; a batch replays the backend's graph of its row count. The hidden rows are copied out
        of the graph's output buffer, which the next step reuses.
        """
        return self._verify(tokens, self.ops.to_host)

    def verify_greedy(self, tokens: list[int]) -> tuple[list[int | None], Any]:
        """verify(), with each row's argmax chosen by the backend (Ops.greedy_rows: None for a non-finite row)
        instead of the rows brought to the host: a plain greedy request's MTP step."""
        return self._verify(tokens, self.ops.greedy_rows)

    def _verify(self, tokens: list[int], take: Callable[[Any], Any]) -> tuple[Any, Any]:
        t0 = time.perf_counter()
        self.kv.checkpoint()  # the caller rolls back to the accepted rows
        if len(tokens) == 1:
            logits, hidden = self.ops.decode_forward(self.model, tokens[0], self.kv, self.step)
        else:
            logits, hidden = self.ops.verify_forward(self.model, tokens, self.kv, self.step)
        hidden = hidden.copy()
        self.kv_tokens.extend(tokens)
        out = take(logits)
        if self.offload is not None:  # a verify batch is a forward through the cache too
            self.offload.note_decode_step(time.perf_counter() - t0)
        return out, hidden

    def rollback(self, n_tokens: int) -> None:
        """Keep the first n_tokens cached positions (rejected drafts, a prefix the drafter cannot use)."""
        self.kv.rollback(n_tokens)
        del self.kv_tokens[n_tokens:]

    def logits_all(self, tokens: list[int]) -> np.ndarray:
        """Logits at every position of `tokens` from an empty cache (parity tests, perplexity)."""
        self.reset()
        if self.offload is not None:
            out = self.offload.prefill(tokens, self.kv, self.config.ubatch, None,
                                       lambda offset, chunk, hidden: self.kv_tokens.extend(chunk), all_logits=True)
            assert out is not None
            return np.concatenate([self.ops.to_host(logits) for logits, _ in out])
        rows = []
        for start in range(0, len(tokens), self.config.ubatch):
            chunk = tokens[start : start + self.config.ubatch]
            logits, _ = self.model.forward(np.asarray(chunk), self.kv, all_logits=True, step=self.step)
            self.kv_tokens.extend(chunk)
            rows.append(self.ops.to_host(logits))
        return np.concatenate(rows)

    def reset(self) -> None:
        if self.offload is not None:
            self.offload.reset()  # after a failed prefill phase: recover, or PhaseError
        self.kv.rollback(0)
        self.kv_tokens.clear()

    def stats(self) -> dict[str, Any]:
        """Expert offload counters: cache, prefill bytes, phase, budget ({} when all experts are resident).
        A split's cards and transfers are `devices.stats()`."""
        return self.offload.stats() if self.offload is not None else {}

    # -- generation -------------------------------------------------------------------------------
    def generate(self, prompt_tokens: list[int], max_tokens: int, sampling: SamplingParams,
                 stop: list[str] | None = None, ignore_eos: bool = False, logprobs: int | None = None,
                 cancelled: Callable[[], bool] | None = None, draft: DraftConfig | None = None,
                 cache_prompt: bool = True) -> Generation:
        """Check a request and prepare its generation; iterate `steps()` (or call `run()`) to produce it.

        `cancelled` lets another thread stop a long prompt between micro-batches (a client gone).
        `draft` (mode "mtp") drafts with the NextN block and verifies in batches; the output is
        what plain decoding gives (greedy: the same tokens; sampling: the same distribution).
        `cache_prompt` False reuses nothing cached: the whole prompt is prefilled (llama.cpp's field).
        """
        draft = draft or DraftConfig()
        check_draft_support(self.model_config, draft)
        if max_tokens < 0:
            raise GenerationError(f"max_tokens must be >= 0, got {max_tokens}")
        max_tokens = fit_to_context(len(prompt_tokens), max_tokens, self.n_ctx)  # past the room: stop at the end
        for t in prompt_tokens:
            if not 0 <= t < self.model_config.n_vocab:
                raise GenerationError(f"prompt token id {t} is outside the vocabulary (0..{self.model_config.n_vocab - 1})")
        if logprobs is not None and not 0 <= logprobs <= 20:
            raise GenerationError(f"top_logprobs must be in 0..20, got {logprobs}")
        req = GenerationRequest(max_tokens, sampling, tuple(stop or ()), ignore_eos, logprobs)
        restored = self._recall(prompt_tokens, draft.enabled, cache_prompt)
        source: TokenSource = plain_tokens(self.decode)
        if self.GREEDY_ON_DEVICE and is_plain_greedy(req):
            source = (chained_greedy_tokens(self._greedy_chain, self.kv_tokens.append, self._settle_chain)
                      if self.GREEDY_AHEAD else greedy_tokens(self.decode_greedy))
        elif self.TOP_K_ON_DEVICE and is_plain_top_k(req, self.model_config.n_vocab):
            source = top_k_tokens(lambda token: self.decode_top_k(token, req.sampling.top_k))
        on_hidden, tail = None, None
        if draft.enabled:
            drafter, policy = self._drafting(draft)
            # The drafter needs the trunk's hidden state of every position its NextN cache lacks.
            self.rollback(self.kv.reachable(min(len(self.kv_tokens), drafter.prepare(prompt_tokens))))
            draft_stats = DraftStats()
            greedy = self.MTP_GREEDY_ON_DEVICE and is_plain_greedy(req)  # drafts and verify rows chosen on the backend
            source, on_hidden = self._speculative_source(drafter, policy, draft_stats, greedy), drafter.add_hidden
            if self.offload is not None:  # catch the NextN block up while the prompt's experts stream
                rows = self.offload.config.prefill_ubatch
                tail = PromptTail(self.model_config.n_layer, lambda: drafter.catch_up(rows))
        # what prefill will keep: a recurrent state returns only to positions it saved
        cached = self.kv.reachable(_common_prefix(self.kv_tokens, prompt_tokens, limit=len(prompt_tokens) - 1))
        gen = Generation(prompt_tokens=len(prompt_tokens), cached_tokens=cached, restored_tokens=min(restored, cached))
        if draft.enabled:
            gen.draft = draft_stats
        gen._steps = generation_loop(gen, req, lambda: self.prefill(prompt_tokens, cancelled, on_hidden, tail), source,
                                     self.tokenizer)
        return gen

    # -- the prompt cache -------------------------------------------------------------------------
    def _recall(self, prompt: list[int], drafting: bool, cache_prompt: bool) -> int:
        """Before a request: save the live sequence to the prompt cache when the request leaves it, and
        restore the saved sequence that shares the most with `prompt` if it beats the live one; the
        positions restored."""
        cache = self.prompt_cache
        if cache is None:
            if not cache_prompt:
                self.rollback(0)
            return 0
        # The live sequence is left when the prompt does not contain its last prompt (another conversation,
        # an edited turn; a continuation or a regenerated reply does), or when it is dropped.
        kept = _common_prefix(self.kv_tokens, prompt, len(prompt))
        leaving = bool(self.kv_tokens) and (not cache_prompt or kept < min(self._prompt_end, len(self.kv_tokens)))
        entry, reuse = None, 0
        if cache_prompt:
            limit = len(prompt) - 1  # prefill needs a token to run
            entry, reuse = cache.find(prompt, limit, need_drafter=drafting)
            if entry is not None and reuse > self.kv.reachable(min(kept, limit)):
                cache.restored(entry, reuse)  # most recently used before the save below, which may evict
            else:
                entry = None
        if leaving:
            cache.offer(self.kv.saved_bytes(), self._saved_entry)
        if entry is None:
            if not cache_prompt:
                self.rollback(0)
            return 0
        self.kv.load(entry.trunk, reuse)
        self.kv_tokens[:] = entry.tokens[:reuse].tolist()
        if drafting and entry.drafter is not None and self.drafter is not None:
            self.drafter.restore(entry.drafter)  # its prepare() then keeps what the prompt shares
        return reuse

    def _saved_entry(self) -> Entry:
        drafter = self.drafter.save() if self.drafter is not None else None
        return Entry(np.asarray(self.kv_tokens, dtype=np.int64), self.kv.save(), drafter)

    # -- MTP drafting -----------------------------------------------------------------------------
    def draft_stats(self) -> dict[str, Any]:
        """Drafting totals over this engine's generations, and the depth the policy is at."""
        depth = self._draft_policy.depth if self._draft_policy is not None else None
        return {**self._draft_totals.to_dict(), "draft_depth": depth}

    def _drafting(self, draft: DraftConfig) -> tuple[MTPDrafter, DepthPolicy]:
        """The NextN drafter (one per engine: its cache follows the sequence) and the depth policy for `draft`."""
        if self.offload is not None and self.offload.config.decode_batch < 1 + draft.depth:
            raise GenerationError(f"--draft-depth {draft.depth} verifies {1 + draft.depth} tokens per batch but the "
                                  f"expert cache is sized for {self.offload.config.decode_batch}")
        if self.drafter is None:
            self.drafter = MTPDrafter(self.nextn[0], self.n_ctx, self._nextn_batch_rows(), self.step)
        self.drafter.graph_rows = 1 + draft.depth
        policy = self._draft_policy
        if policy is None or (policy.max_depth, policy.adaptive) != (draft.depth, draft.adaptive):
            policy = self._draft_policy = DepthPolicy(draft.depth, draft.adaptive)
        return self.drafter, policy

    def _nextn_batch_rows(self) -> int:
        """Rows per NextN catch-up batch (a prompt's states): a micro-batch, or what the expert cache serves."""
        if self.offload is None:
            return self.config.ubatch
        return self.offload.cache_batch(self.config.ubatch, [self.model_config.n_layer])  # the NextN block is blk.n_layer

    def _speculative_source(self, drafter: MTPDrafter, policy: DepthPolicy, stats: DraftStats,
                            greedy: bool = False) -> TokenSource:
        def source(logits: np.ndarray, sampler: Any, counts: dict[int, int], room: Callable[[], int]) -> Any:
            return speculative_tokens(self, drafter, policy, [stats, self._draft_totals], logits, sampler, counts, room,
                                      greedy)

        return source


class _TimedChain:
    """A greedy chain whose takes are timed for the offload's cost model: the time between takes is what a step
    costs while the chain runs (the first from its submit)."""

    def __init__(self, chain: Any, note: Callable[[float], None]):
        self.chain, self.note, self._since = chain, note, 0.0

    def submit(self, token: int | None) -> None:
        if not self._since:
            self._since = time.perf_counter()
        self.chain.submit(token)

    def take(self) -> int | None:
        chosen = self.chain.take()
        now = time.perf_counter()
        self.note(now - self._since)
        self._since = now
        return chosen


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y or n >= limit:
            break
        n += 1
    return n
