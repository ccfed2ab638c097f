"""Acceptance statistics of MTP drafting: per depth position, per verify step, with the time spent."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MAX_DRAFT_DEPTH = 3  # verify batches stay at 4 rows or fewer (DESIGN.md)


@dataclass
class DraftStats:
    """Counts over verify steps. Position i (0-based) is the i+1-th draft of a step."""

    drafted: list[int] = field(default_factory=lambda: [0] * MAX_DRAFT_DEPTH)
    accepted: list[int] = field(default_factory=lambda: [0] * MAX_DRAFT_DEPTH)
    verify_steps: int = 0
    verify_tokens: int = 0  # tokens the verify steps produced: the accepted drafts plus one per step
    draft_s: float = 0.0
    verify_s: float = 0.0

    def record(self, n_drafted: int, n_accepted: int, draft_s: float, verify_s: float) -> None:
        for i in range(n_drafted):
            self.drafted[i] += 1
            self.accepted[i] += i < n_accepted
        self.verify_steps += 1
        self.verify_tokens += n_accepted + 1
        self.draft_s += draft_s
        self.verify_s += verify_s

    @property
    def drafted_n(self) -> int:
        return sum(self.drafted)

    @property
    def accepted_n(self) -> int:
        return sum(self.accepted)

    @property
    def acceptance(self) -> float | None:
        return self.accepted_n / self.drafted_n if self.drafted_n else None

    def acceptance_by_depth(self) -> list[float | None]:
        """Fraction of the drafts at each position that were accepted (None where none was drafted)."""
        return [a / d if d else None for a, d in zip(self.accepted, self.drafted)]

    @property
    def tokens_per_verify(self) -> float:
        return self.verify_tokens / self.verify_steps if self.verify_steps else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "drafted_n": self.drafted_n,
            "accepted_n": self.accepted_n,
            "draft_acceptance": self.acceptance,
            "drafted_by_depth": list(self.drafted),
            "accepted_by_depth": list(self.accepted),
            "draft_acceptance_by_depth": self.acceptance_by_depth(),
            "verify_steps": self.verify_steps,
            "tokens_per_verify": self.tokens_per_verify,
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
        }

    def summary(self) -> str:
        """One phrase for a summary line: drafted, accepted, acceptance per depth, tokens per verify step."""
        rate = f"{self.acceptance:.0%}" if self.acceptance is not None else "-"
        by_depth = " ".join(f"{r:.0%}" if r is not None else "-" for r in self.acceptance_by_depth())
        return (f"draft {self.drafted_n} drafted, {self.accepted_n} accepted ({rate}; by depth {by_depth}), "
                f"{self.tokens_per_verify:.2f} tok/verify")
