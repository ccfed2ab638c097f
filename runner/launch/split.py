"""`--devices`: a launch's device list resolved against the backend, and a split launch's context.

One device is today's launch (the CUDA backend runs on device 0; another id is refused, since CudaOps
never switches devices). Two or more split the layers (launch/devices.py): the numpy backend emulates
the cards; the CUDA backend refuses in one line until CudaOps runs per-device (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runner.errors import DeviceMemoryError
from runner.launch.devices import SplitConfig, parse_devices

if TYPE_CHECKING:
    from runner.gguf_file import GGUFFile
    from runner.launch.context import ContextChoice
    from runner.models.config import ModelConfig
    from runner.offload.offload import OffloadConfig

NUMPY_EMULATED_DEVICES = 8  # the most cards the numpy backend emulates (the largest box lent has 8)


def check_devices(text: str, backend: str) -> tuple[int, ...]:
    """The ids of `--devices text` on `backend` ("cuda" or "numpy"); BackendError (one line) for what it cannot run."""
    from runner.launch.backend import BackendError

    visible = _cuda_device_count() if backend == "cuda" else NUMPY_EMULATED_DEVICES
    ids = parse_devices(text, visible)
    if backend == "cuda" and len(ids) > 1:
        raise BackendError(f"--devices {text}: splitting layers across cards is planned for the cuda backend "
                           f"(docs/ARCHITECTURE.md) but not built yet; run on one card, or --backend numpy to "
                           f"emulate the split")
    if backend == "cuda" and ids != (0,):
        raise BackendError(f"--devices {text}: the cuda backend runs on device 0; pick the card with "
                           f"CUDA_VISIBLE_DEVICES={ids[0]} instead")
    return ids


def _cuda_device_count() -> int:
    import cupy

    return int(cupy.cuda.runtime.getDeviceCount())


def split_config(ids: tuple[int, ...], budget_bytes: int, offload: OffloadConfig | None, cfg: ModelConfig,
                 rows: int, kv_type: str) -> SplitConfig:
    """The split for `ids`, each card with `budget_bytes`; under offload the slots its config asks for
    (`auto`: the fewest a decode batch needs), accounted on each layer's card; `rows`: the prompt micro-batch;
    `kv_type`: the K/V cache's element type."""
    from runner.offload.sizing import min_slots

    slots, decode_batch = None, 1
    if offload is not None:
        asked, decode_batch = offload.cache_slots, offload.decode_batch
        slots = min_slots(cfg, decode_batch) if asked == "auto" else int(asked)
    return SplitConfig(ids, budget_bytes, slots, rows, kv_type, decode_batch)


def split_context(split: SplitConfig, f: GGUFFile, cfg: ModelConfig, asked: int | None,
                  asked_by: str = "-c") -> ContextChoice:
    """`asked` (cut to the model's), checked by planning the split; without it the model's context_length,
    halved until the cards hold it (at least 256 tokens)."""
    from runner.launch.context import CTX_ALIGN, ContextChoice

    if asked is not None:
        n = min(asked, cfg.n_ctx_train)
        split.plan(f, cfg, n)  # DeviceMemoryError names the shortfall
        what = f"-c {asked}" if asked_by == "-c" else asked_by
        return ContextChoice(n, what, noteworthy=n < asked)
    n = cfg.n_ctx_train
    while True:
        try:
            split.plan(f, cfg, n)
            break
        except DeviceMemoryError:
            if n <= CTX_ALIGN:
                raise
            n = max(CTX_ALIGN, n // 2 // CTX_ALIGN * CTX_ALIGN)
    if n == cfg.n_ctx_train:
        return ContextChoice(n, f"the model's context_length {n}")
    return ContextChoice(n, f"the model's {cfg.n_ctx_train} halved until {len(split.devices)} cards hold it",
                         noteworthy=True)
