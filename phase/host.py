"""What the prefill phase transaction needs from an engine: a small protocol, nothing of its internals."""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence

WarmExperts = Mapping[int, Sequence[int]]  # MoE layer -> experts to refill, the most useful first


class PhaseHost(Protocol):
    @property
    def healthy(self) -> bool: ...

    @property
    def unhealthy_reason(self) -> str | None: ...

    def mark_unhealthy(self, reason: str) -> None: ...

    def mark_healthy(self) -> None: ...

    def generation(self) -> int:
        """A counter that moves whenever decode state (slots, graphs, workspaces) is used or changed
        outside the transaction; the transaction's own release and restore do not move it."""
        ...

    def slot_count(self) -> int:
        """Expert cache slots per layer held now (0 while released)."""
        ...

    def quiesce(self) -> None:
        """Wait for every stream: nothing in flight may touch what is about to be released."""
        ...

    def invalidate_graphs(self) -> None:
        """Drop captured decode graphs whose memory the prompt may take; graphs kept through the prompt
        (their temporaries where the prompt cannot reach) stay as they are."""
        ...

    def release_slots(self) -> None: ...

    def release_workspaces(self) -> None: ...

    def reserve_prefill_buffers(self, n_tokens: int) -> None:
        """Staging and micro-batch buffers for an `n_tokens` prompt (raises if they do not fit)."""
        ...

    def free_prefill_buffers(self) -> None: ...

    def restore_workspaces(self) -> None: ...

    def restore_slots(self, warm: WarmExperts | None) -> None: ...

    def restore_graphs(self) -> None:
        """Make dropped decode graphs valid again (recapture now or on the next step); kept ones replay at
        the first step after the prompt."""
        ...

    def recover(self) -> None:
        """From whatever a failure left, back to ready: prefill buffers freed, slots (cold),
        workspaces and graphs restored; raises if that is impossible."""
        ...
