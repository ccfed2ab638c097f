"""From the command line's launch flags to the engine's configuration: profile, offload, drafting, backend.

`--profile auto` (the default) keeps every expert resident when the whole model fits the VRAM
budget, and applies the qualified profile (home-24g) when it does not, if that profile suits the
model; otherwise it offloads unqualified (slots: auto) and says why. `--profile NAME` applies NAME
and refuses explicit flags that contradict it; `--profile none` launches unqualified. Expert
offload is on with a profile, with --offload, or whenever an offload setting is given. The context is
-c as given, or the model's context_length capped by the budget (launch/context.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from runner.backends.budget import GIB
from runner.backends.kv_type import DEFAULT_KV_TYPE, check_kv_type
from runner.errors import ProfileError
from runner.launch.devices import SplitConfig, parse_devices
from runner.launch.profiles import LaunchSettings, Profile, check_vram_budget, load_profile, resolve_launch
from runner.units import size_text

if TYPE_CHECKING:  # the heavy modules load when a launch is resolved, not when the CLI starts
    from runner.engine.engine import EngineConfig
    from runner.gguf_file import GGUFFile
    from runner.launch.backend import BackendConfig
    from runner.launch.context import ContextChoice, ContextCost
    from runner.models.config import ModelConfig
    from runner.offload.offload import OffloadConfig
    from runner.spec.config import DraftConfig

AUTO_PROFILE = "home-24g"  # what `--profile auto` applies to a model that does not fit the budget
EMULATED_CARD_GIB = 24  # the numpy backend's stand-in for the card when no --vram-budget is given
MAX_DRAFT_DEPTH = 3


@dataclass(frozen=True)
class LaunchOptions:
    """The launch flags as given on the command line; None: not given."""

    profile: str = "auto"
    offload: bool | None = None
    cache_slots: str | None = None
    cache_policy: str | None = None
    prefill_order: str | None = None
    prefill_ubatch: int | None = None
    transaction: str | None = None
    warm_fill: str | None = None
    decode_graph: str | None = None
    ubatch: int | None = None
    vram_budget_gib: float | None = None
    draft: str | None = None
    draft_depth: int | None = None
    draft_fixed: bool = False
    backend: str = "auto"
    devices: str | None = None  # --devices 0,1: the layers split across these cards
    kv_type: str = DEFAULT_KV_TYPE  # --cache-type: the K/V cache's element type

    OFFLOAD_FLAGS = {"cache_slots": "--cache-slots", "cache_policy": "--cache-policy",
                     "prefill_order": "--prefill-order", "prefill_ubatch": "--prefill-ubatch",
                     "transaction": "--transaction", "warm_fill": "--warm-fill", "decode_graph": "--decode-graph"}

    def __post_init__(self) -> None:
        if self.vram_budget_gib is not None:  # sizes the launch before LaunchSettings would see it
            check_vram_budget(self.vram_budget_gib)
        if self.devices is not None:  # the ids' syntax; what the backend sees is checked when it is chosen
            parse_devices(self.devices)
        check_kv_type(self.kv_type, ProfileError)

    def offload_flags_given(self) -> list[str]:
        return [flag for name, flag in self.OFFLOAD_FLAGS.items() if getattr(self, name) is not None]


@dataclass(frozen=True)
class Launch:
    """A resolved launch: what the engine, the backend and the generations are configured with."""

    settings: LaunchSettings
    offload: OffloadConfig | None  # None: every expert resident
    backend: BackendConfig
    draft: DraftConfig
    why: str  # one line: how the launch was chosen
    context: ContextChoice
    split: SplitConfig | None = None  # --devices with two or more cards (numpy: emulated)
    split_summary: str = ""  # "layers 0-23 on cuda:0 (...), 24-47 on cuda:1 (...)"

    @property
    def n_ctx(self) -> int:
        return self.context.n_ctx

    def engine_config(self, n_ctx: int | None = None) -> EngineConfig:
        """The engine's configuration, at the launch's context unless `n_ctx` is given."""
        from runner.engine.engine import EngineConfig

        return EngineConfig(n_ctx=n_ctx or self.n_ctx, ubatch=self.settings.server_ubatch, offload=self.offload,
                            split=self.split)

    def make_ops(self) -> Any:
        from runner.launch.backend import BackendError, make_ops

        try:
            return make_ops(self.backend)
        except BackendError as exc:
            if self.settings.profile is None:
                raise
            raise BackendError(f"profile '{self.settings.profile}': {exc}; launch unqualified with --profile none "
                               f"and a --vram-budget that fits") from None

    def summary(self) -> str:
        """One line: how the launch was chosen and what it runs with."""
        s, parts = self.settings, []
        if self.offload is not None:
            o = self.offload
            parts.append(f"{o.cache_slots} cache slots per MoE layer ({o.cache_policy}), {o.prefill_order} prefill "
                         f"at micro-batch {o.prefill_ubatch}, transaction {o.transaction}, warm fill from {o.warm_fill}"
                         + (f", CUDA decode graphs by {o.decode_graph}" if o.decode_graph != "directory" else ""))
        elif self.split is not None and self.split.slots is not None:
            parts.append(f"{self.split.slots} expert slots per MoE layer accounted on its card (numpy emulation: "
                         f"experts read from host RAM)")
        else:
            parts.append("every expert resident")
        if self.split is not None:
            parts.append(self.split_summary)
        parts.append(f"ubatch {s.server_ubatch}")
        parts.append(f"K/V cache {self.backend.kv_type}")
        if self.draft.enabled:
            parts.append(f"draft mtp to depth {self.draft.depth}{'' if self.draft.adaptive else ' (fixed)'}")
        if s.vram_budget_gib is not None:
            parts.append(f"VRAM budget {s.vram_budget_gib:g} GiB")
        parts.append(f"context {self.n_ctx} ({self.context.why})")
        return f"{self.why}; " + ", ".join(parts)

    @property
    def worth_announcing(self) -> bool:
        """An offloaded or profiled launch, or a context other than the one asked for or the model's."""
        return (self.offload is not None or self.settings.profile is not None or self.context.noteworthy
                or self.split is not None)

    def to_dict(self) -> dict[str, Any]:
        """Every setting, for JSON outputs and the server's /props (MEASURING.md: state the environment)."""
        off = None
        if self.offload is not None:
            off = {k: v for k, v in asdict(self.offload).items() if k != "phase_cost"}
        return {"profile": self.settings.profile, "why": self.why, "settings": asdict(self.settings),
                "offload": off, "backend": asdict(self.backend), "draft": asdict(self.draft),
                "n_ctx": self.n_ctx, "n_ctx_why": self.context.why,
                "split": None if self.split is None else {**asdict(self.split), "plan": self.split_summary}}


def resolve(opts: LaunchOptions, model_file: GGUFFile, n_ctx: int | None = None, n_ctx_by: str = "-c") -> Launch:
    """The launch for `opts` on this model at context `n_ctx` (-c, or what `n_ctx_by` names; None: the model's,
    capped by the budget); ProfileError (one line) for flags that contradict each other, DeviceMemoryError
    for a context that does not fit."""
    from runner.launch.backend import BackendConfig
    from runner.launch.context import FIT_CTX_MIN, choose_context
    from runner.launch.split import check_devices, split_config, split_context
    from runner.models.config import model_config
    from runner.offload.offload import offload_config
    from runner.spec.config import DraftConfig, check_draft_support

    cfg = model_config(model_file)
    given = opts.offload_flags_given()
    if opts.offload is False and given:
        raise ProfileError(f"{', '.join(given)} {'configure' if len(given) > 1 else 'configures'} expert offload, "
                           f"which --no-offload turns off; drop one or the other")
    backend = _backend_name(opts.backend)
    ids = check_devices(opts.devices, backend) if opts.devices is not None else (0,)  # before any sizing
    # Without -c, all-resident or offloaded is decided at the context a default launch keeps at least.
    placement_ctx = n_ctx if n_ctx is not None else min(cfg.n_ctx_train, FIT_CTX_MIN)
    profile, offload, why = _choose(opts, cfg, model_file, placement_ctx, backend)
    try:
        settings = resolve_launch(profile, _explicit(opts, profile))
    except ProfileError as exc:
        if opts.profile.lower() == "auto" and profile is not None:
            raise ProfileError(f"--profile auto chose '{profile.name}' ({why}): {exc}") from None
        raise
    if offload and isinstance(settings.cache_slots, int):
        _check_slots_fit(settings.cache_slots, cfg)
    draft = DraftConfig(settings.drafter, settings.draft_depth or MAX_DRAFT_DEPTH, adaptive=not opts.draft_fixed)
    check_draft_support(cfg, draft)
    off = None
    if offload:
        overrides = {k: getattr(opts, k) for k in ("cache_policy", "prefill_order", "transaction", "decode_graph")
                     if getattr(opts, k) is not None}
        if backend == "numpy" and settings.vram_budget_gib is None:
            overrides["vram_budget_bytes"] = EMULATED_CARD_GIB * GIB
        off = offload_config(settings, **overrides)
    if backend == "cuda":
        budget = settings.vram_budget_gib
    else:  # numpy: with offload the budget sizes the emulated card; without, make_ops refuses it (nothing to size)
        budget = None if offload else opts.vram_budget_gib
    if len(ids) > 1:  # numpy (check_devices refuses a cuda split): the emulated cards hold the slots themselves
        split = split_config(ids, _budget_bytes(settings.vram_budget_gib, backend), off, cfg, settings.server_ubatch,
                             opts.kv_type)
        context = split_context(split, model_file, cfg, n_ctx, n_ctx_by)
        plan, _ = split.plan(model_file, cfg, context.n_ctx)
        return Launch(settings, None, BackendConfig(opts.backend, kv_type=opts.kv_type), draft, why, context, split,
                      plan.summary())
    cost = _context_cost(model_file, cfg, off, draft.enabled, settings, opts.vram_budget_gib is not None, backend,
                         opts.kv_type)
    context = choose_context(n_ctx, cfg.n_ctx_train, cost, n_ctx_by)
    return Launch(settings, off, BackendConfig(opts.backend, budget, opts.kv_type), draft, why, context)


def _context_cost(f: GGUFFile, cfg: ModelConfig, offload: OffloadConfig | None, drafting: bool,
                  settings: LaunchSettings, flag_budget: bool, backend: str, kv_type: str) -> ContextCost:
    """What the launch holds on the card besides its context, against the budget it runs under."""
    from runner.launch.context import offload_cost, resident_cost

    budget = _budget_bytes(settings.vram_budget_gib, backend)
    if settings.vram_budget_gib is not None and not flag_budget:
        source = f"VRAM budget of profile '{settings.profile}'"
    else:
        source = _budget_source(settings.vram_budget_gib, backend)
    name = f"the {budget / GIB:.2f} GiB {source}"
    if offload is None:
        return resident_cost(f, cfg, drafting, budget, name, kv_type)
    scratch = 0
    if backend == "cuda":  # the expert GEMM's chunks in the prefill phase (ExpertOffload reserves them too)
        from runner.backends.cuda.moe_prefill import moe_prefill_scratch_bytes

        scratch = moe_prefill_scratch_bytes(cfg)
    return offload_cost(f, cfg, offload, drafting, budget, name, scratch, kv_type)


def _backend_name(name: str) -> str:
    """The backend `name` resolves to; --backend cuda without a GPU fails here, as make_ops would."""
    from runner.backends.cuda.kernels import CudaUnavailable, _require_gpu, gpu_available

    if name == "auto":
        return "cuda" if gpu_available() else "numpy"
    if name == "cuda":
        from runner.launch.backend import BackendError

        try:
            _require_gpu()
        except CudaUnavailable as exc:
            raise BackendError(f"--backend cuda: {exc}") from None
    return name


def _choose(opts: LaunchOptions, cfg: ModelConfig, f: GGUFFile, n_ctx: int,
            backend: str) -> tuple[Profile | None, bool, str]:
    """(profile, offload on, why) for the --profile and --offload flags."""
    wants_offload = opts.offload is True or bool(opts.offload_flags_given())
    name = opts.profile.lower()
    if name == "none":
        return None, wants_offload, "unqualified (--profile none)"
    if name != "auto":
        profile = load_profile(opts.profile)
        assert profile is not None
        if opts.offload is False:
            raise ProfileError(f"--no-offload contradicts profile '{profile.name}', which offloads the routed "
                               f"experts; drop --no-offload, or pass --profile none to launch unqualified")
        misfit = profile_misfit(profile, cfg)
        if misfit:
            raise ProfileError(f"profile '{profile.name}' does not suit this model: {misfit}; launch unqualified "
                               f"with --profile none (add --cache-slots N|auto to offload experts)")
        return profile, True, f"profile '{profile.name}' as asked"
    if opts.offload is False:
        return None, False, "every expert resident (--no-offload)"
    need = _model_bytes(f, cfg, n_ctx, opts.kv_type)
    budget, where = _budget_bytes(opts.vram_budget_gib, backend), _budget_source(opts.vram_budget_gib, backend)
    fits = f"the model's {size_text(need)} (weights and KV cache) {{}} the {budget / GIB:.2f} GiB {where}"
    if need <= budget:
        if wants_offload:
            return None, True, "unqualified expert offload as asked; " + fits.format("fit")
        return None, False, "every expert resident: " + fits.format("fit")
    profile = load_profile(AUTO_PROFILE)
    assert profile is not None
    misfit = profile_misfit(profile, cfg)
    if misfit:
        return None, True, (f"unqualified expert offload: {fits.format('do not fit')} and profile "
                            f"'{profile.name}' does not suit this model ({misfit})")
    return profile, True, f"profile '{profile.name}': " + fits.format("do not fit")


def profile_misfit(profile: Profile, cfg: ModelConfig) -> str | None:
    """Why `profile`'s settings cannot run on a model of `cfg` (None: they can)."""
    why = []
    slots = profile.launch.cache_slots
    if isinstance(slots, int) and slots > cfg.n_expert:
        why.append(f"it holds {slots} cache slots per MoE layer and this model has {cfg.n_expert} routed experts "
                   f"per layer")
    if profile.launch.drafter == "mtp" and cfg.n_nextn < 1:
        why.append(f"it drafts with a NextN (MTP) block and this {cfg.arch} model has none")
    return "; ".join(why) or None


def _check_slots_fit(slots: int, cfg: ModelConfig) -> None:
    """A slot count past the experts of a layer (a profile's was refused by profile_misfit already)."""
    if slots <= cfg.n_expert:
        return
    raise ProfileError(f"--cache-slots {slots} is more than the {cfg.n_expert} routed experts per MoE layer of this "
                       f"model; use --cache-slots {cfg.n_expert} (every expert cached) or auto, or --no-offload to "
                       f"keep every expert resident")


def _explicit(opts: LaunchOptions, profile: Profile | None) -> dict[str, Any]:
    from runner.offload.sizing import parse_cache_slots

    depth = opts.draft_depth
    if opts.draft == "mtp" and depth is None and profile is None:
        depth = MAX_DRAFT_DEPTH  # --draft mtp alone drafts to the most depth, adapting down
    return {"vram_budget_gib": opts.vram_budget_gib, "server_ubatch": opts.ubatch,
            "prefill_ubatch": opts.prefill_ubatch,
            "cache_slots": parse_cache_slots(opts.cache_slots) if opts.cache_slots is not None else None,
            "drafter": opts.draft, "draft_depth": depth, "warm_fill": opts.warm_fill}


def _model_bytes(f: GGUFFile, cfg: ModelConfig, n_ctx: int, kv_type: str) -> int:
    """Every tensor (routed experts included) and the KV cache: what an all-resident launch keeps on the card."""
    from runner.offload.sizing import kv_cache_bytes

    return sum(t.nbytes for t in f.tensors.values()) + kv_cache_bytes(cfg, min(n_ctx, cfg.n_ctx_train), kv_type)


def _budget_bytes(budget_gib: float | None, backend: str) -> int:
    if budget_gib is not None:
        return int(budget_gib * GIB)
    if backend == "cuda":
        from runner.backends.cuda.ops import free_device_bytes

        return free_device_bytes()
    return EMULATED_CARD_GIB * GIB


def _budget_source(budget_gib: float | None, backend: str) -> str:
    if budget_gib is not None:
        return "--vram-budget"
    return "free on the GPU" if backend == "cuda" else "emulated card (numpy backend)"

