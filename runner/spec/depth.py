"""The draft depth of each verify step: fixed, or adapted online from measured costs and acceptance."""

from __future__ import annotations

from dataclasses import dataclass, field

from runner.errors import GenerationError
from runner.spec.stats import MAX_DRAFT_DEPTH


@dataclass
class DepthPolicy:
    """Picks the depth d (drafts per verify step, 0..max_depth) and, if adaptive, revises it after each step.

    The rule. Let c_draft be the cost of one draft step, c_verify(r) that of a verify batch of r rows
    and a_i the chance that draft i is accepted given drafts 1..i-1 were. Depth d then yields
        E(d) = 1 + a_1 + a_1 a_2 + ... + a_1 ... a_d   tokens per verify step, in
        T(d) = d c_draft + c_verify(d + 1)            seconds.
    After each step: move to d-1 if E(d-1)/T(d-1) > (1 + margin) E(d)/T(d); otherwise move to d+1
    (d+1 <= max_depth) if E(d+1)/T(d+1) > (1 + margin) E(d)/T(d); otherwise stay. One step at a time.

    Estimates: exponential moving averages (weight `decay` on the past) of the measured wall time of
    a draft step and of a verify batch of each row count, and of the 0/1 acceptance at each position
    the step reached (a position past the first rejection tells nothing). A row count never measured
    is extrapolated linearly from the two nearest measured ones, or proportionally (c(r0) r / r0)
    from a single one. A position never drafted is assumed to accept like the one before it
    (position 1: `prior_acceptance`). The averages decay per verify step, not per observation: a
    position seen again after g silent steps takes weight 1 - decay^g, so a probe's answer counts
    as much as the g steps it stands for (with weight 1 - decay, a depth of 0 held the stale
    acceptance of the deeper steps before it for a hundred tokens and could climb back on it).

    Below max_depth, a step runs one draft deeper (a probe) once `probe_every` steps have passed
    since the last, so the estimate of the next position stays fresh and the depth can rise again
    once drafts pay; depth 0 is plain decoding, probed at depth 1. A probe that leaves the depth
    where it was doubles the wait for the next one, up to `probe_max`; any change of depth resets
    it. Probes are dear: after g steps at depth 0 a probe also feeds the NextN block the g trunk
    rows it skipped (on the 8-layer seed shape under offload, 16 rows cost about 40 ms against a
    2.8 ms token), so drafts that never land must cost little more than plain decoding.
    """

    max_depth: int = MAX_DRAFT_DEPTH
    adaptive: bool = True
    decay: float = 0.9
    margin: float = 0.02
    probe_every: int = 16
    probe_max: int = 256
    prior_acceptance: float = 0.5
    depth: int = field(init=False)
    accept: list[float | None] = field(init=False)  # EMA of a_1 .. a_max
    draft_step_s: float | None = field(init=False, default=None)
    verify_s: dict[int, float] = field(init=False, default_factory=dict)  # rows -> EMA seconds
    _steps_since_probe: int = field(init=False, default=0)
    _probe_wait: int = field(init=False, default=0)  # steps between probes now: probe_every .. probe_max
    _step: int = field(init=False, default=0)  # verify steps observed
    _seen_at: list[int | None] = field(init=False)  # the step each position was last observed at

    def __post_init__(self) -> None:
        if not 1 <= self.max_depth <= MAX_DRAFT_DEPTH:
            raise GenerationError(f"draft depth must be in 1..{MAX_DRAFT_DEPTH}, got {self.max_depth}")
        if self.probe_max < self.probe_every:
            raise GenerationError(f"probe_max {self.probe_max} is below probe_every {self.probe_every}")
        self.depth = self.max_depth
        self.accept = [None] * self.max_depth
        self._seen_at = [None] * self.max_depth
        self._probe_wait = self.probe_every

    def next_depth(self) -> int:
        """The depth of the next verify step: the policy's, or one deeper for a probe."""
        if self.adaptive and self.depth < self.max_depth and self._steps_since_probe >= self._probe_wait:
            return self.depth + 1
        return self.depth

    def observe(self, drafted: int, accepted: int, draft_s: float | None, verify_s: float | None) -> None:
        """One verify step: its depth, drafts accepted, seconds drafting (None: not representative,
        e.g. the NextN block caught up a whole prompt, or a draft step warmed up or captured a CUDA graph)
        and verifying (None: not representative, a CUDA graph's warm-up or capture, 5 to 15 ms against a
        3 ms replay under offload)."""
        if not self.adaptive:
            return
        self._step += 1
        for i in range(min(accepted + 1, drafted)):  # positions reached: the accepted ones and the first rejection
            seen = self._seen_at[i]
            old = self.accept[i] if self.accept[i] is not None else self.prior_acceptance
            self.accept[i] = self._ema(old, float(i < accepted), 1 if seen is None else self._step - seen)
            self._seen_at[i] = self._step
        if drafted and draft_s is not None:
            self.draft_step_s = self._ema(self.draft_step_s, draft_s / drafted)
        if verify_s is not None:
            self.verify_s[drafted + 1] = self._ema(self.verify_s.get(drafted + 1), verify_s)
        probed = drafted > self.depth
        self._steps_since_probe = 0 if probed else self._steps_since_probe + 1
        depth = self._choose(self.depth)
        if depth != self.depth:
            self._probe_wait = self.probe_every
        elif probed:
            self._probe_wait = min(2 * self._probe_wait, self.probe_max)
        self.depth = depth

    # -- the model ------------------------------------------------------------------------------
    def acceptance(self, position: int) -> float:
        """a_{position+1} as the rule uses it: measured, else like the position before (else the prior)."""
        a = self.prior_acceptance
        for i in range(position + 1):
            a = self.accept[i] if self.accept[i] is not None else a
        return a

    def expected_tokens(self, depth: int) -> float:
        """E(depth): tokens per verify step."""
        total, chain = 1.0, 1.0
        for i in range(depth):
            chain *= self.acceptance(i)
            total += chain
        return total

    def verify_cost(self, rows: int) -> float | None:
        known = self.verify_s
        if rows in known:
            return known[rows]
        if not known:
            return None
        if len(known) == 1:
            (r0, c0), = known.items()
            return c0 * rows / r0
        (r1, c1), (r2, c2) = sorted(known.items(), key=lambda rc: (abs(rc[0] - rows), rc[0]))[:2]
        slope = (c2 - c1) / (r2 - r1)
        return max(c1 + slope * (rows - r1), 0.1 * min(known.values()))  # noise must not make a batch free

    def step_cost(self, depth: int) -> float | None:
        """T(depth): seconds per verify step, None while a needed cost is unmeasured."""
        verify = self.verify_cost(depth + 1)
        if verify is None or (depth > 0 and self.draft_step_s is None):
            return None
        return depth * (self.draft_step_s or 0.0) + verify

    def rate(self, depth: int) -> float | None:
        """E(depth) / T(depth): expected tokens per second."""
        cost = self.step_cost(depth)
        return self.expected_tokens(depth) / cost if cost else None

    def _choose(self, depth: int) -> int:
        here = self.rate(depth)
        if here is None:
            return depth
        for candidate in (depth - 1, depth + 1):  # lowering is checked first: it is the safe direction
            if 0 <= candidate <= self.max_depth:
                there = self.rate(candidate)
                if there is not None and there > here * (1.0 + self.margin):
                    self._steps_since_probe = 0
                    return candidate
        return depth

    def _ema(self, old: float | None, new: float, steps: int = 1) -> float:
        """The average after `steps` verify steps of which only the last observed anything."""
        keep = self.decay ** steps
        return new if old is None else keep * old + (1.0 - keep) * new
