"""How a generation drafts: the draft mode and depth, checked once where the launch is resolved."""

from __future__ import annotations

from dataclasses import dataclass

from runner.errors import GenerationError
from runner.models.config import ModelConfig
from runner.spec.stats import MAX_DRAFT_DEPTH

DRAFT_MODES = ("none", "mtp")


@dataclass(frozen=True)
class DraftConfig:
    mode: str = "none"  # "mtp": draft with the model's NextN block; "none": plain decoding
    depth: int = MAX_DRAFT_DEPTH  # drafts per verify step (the most, when adaptive)
    adaptive: bool = True  # lower (and raise again) the depth from measured costs and acceptance

    def __post_init__(self) -> None:
        if self.mode not in DRAFT_MODES:
            raise GenerationError(f"unknown draft mode '{self.mode}'; choose from {', '.join(DRAFT_MODES)}")
        if not 1 <= self.depth <= MAX_DRAFT_DEPTH:
            raise GenerationError(f"--draft-depth must be in 1..{MAX_DRAFT_DEPTH}, got {self.depth}")

    @property
    def enabled(self) -> bool:
        return self.mode == "mtp"


def check_draft_support(cfg: ModelConfig, draft: DraftConfig) -> None:
    """`mtp` needs a NextN block in the file: say so at start-up rather than fall back to plain decoding."""
    if draft.enabled and cfg.n_nextn < 1:
        raise GenerationError(f"--draft mtp needs a NextN (MTP) block and this {cfg.arch} model has none; "
                              f"use --draft none")
