"""The adaptive draft depth rule, driven by injected costs and acceptances (no timing here)."""

from __future__ import annotations

import numpy as np
import pytest

from runner.errors import GenerationError
from runner.spec.depth import DepthPolicy


def run(policy: DepthPolicy, steps: int, accept: list[float], draft_s: float, verify_s, seed: int = 0) -> list[int]:
    """Feed `steps` verify steps: position i accepted with probability accept[i] (given the ones before),
    a draft step costs draft_s and a verify batch of r rows verify_s(r). Returns the depth of each step."""
    rng = np.random.default_rng(seed)
    depths = []
    for _ in range(steps):
        depth = policy.next_depth()
        n = 0
        while n < depth and rng.random() < accept[n]:
            n += 1
        policy.observe(depth, n, draft_s * depth, verify_s(depth + 1))
        depths.append(depth)
    return depths


def gpu_like(rows: int) -> float:
    return 1.0 + 0.05 * (rows - 1)  # extra verify rows nearly free


def cpu_like(rows: int) -> float:
    return 1.0 * rows  # every row costs a full decode step


def test_high_acceptance_and_cheap_rows_keep_the_full_depth() -> None:
    depths = run(DepthPolicy(3), 200, [0.9, 0.85, 0.8], draft_s=0.05, verify_s=gpu_like)
    assert set(depths[-100:]) == {3}


def test_drafts_that_never_land_turn_drafting_off_with_probes_ever_further_apart() -> None:
    policy = DepthPolicy(3, probe_every=16, probe_max=64)
    depths = run(policy, 400, [0.0, 0.0, 0.0], draft_s=0.05, verify_s=gpu_like)
    off = depths.index(0)
    probes = [i for i, d in enumerate(depths) if i > off and d > 0]
    assert set(depths[off:]) == {0, 1} and policy.depth == 0
    gaps = [b - a for a, b in zip([off - 1, *probes], probes)]  # the step that turned drafting off, then each probe
    assert gaps[:4] == [17, 33, 65, 65]  # the wait doubles after each probe that changes nothing, up to probe_max
    assert set(gaps[3:]) == {65}


def test_a_probe_after_a_long_silence_weighs_what_the_silence_stands_for() -> None:
    policy = DepthPolicy(3)
    policy.depth, policy.accept = 0, [0.4, None, None]
    policy.draft_step_s, policy.verify_s = 0.05, {1: 1.0, 2: 1.05}
    policy._seen_at[0] = 0
    policy._step = 31  # the last draft was 32 steps ago
    policy.observe(1, 0, 0.05, 1.05)
    assert policy.accept[0] == pytest.approx(0.4 * 0.9**32)  # not 0.4 * 0.9: a stale estimate would linger
    assert policy.depth == 0


def test_a_weak_second_position_settles_at_depth_one() -> None:
    # E(1)/T(1) = 1.9/1.4 = 1.36 beats E(2)/T(2) = 1.99/1.8 = 1.11 and E(0)/T(0) = 1.0.
    verify = lambda rows: 1.0 + 0.3 * (rows - 1)
    depths = run(DepthPolicy(3), 300, [0.9, 0.1, 0.1], draft_s=0.1, verify_s=verify)
    assert depths[-100:].count(1) >= 90  # the rest: probes at depth 2, one in 17 steps


def test_expensive_rows_make_deep_drafts_lose_even_at_good_acceptance() -> None:
    # With verify ~ rows (the numpy backend), E(d)/T(d) falls with d unless nearly every draft lands.
    depths = run(DepthPolicy(3), 200, [0.7, 0.7, 0.7], draft_s=0.2, verify_s=cpu_like)
    assert depths[-50:].count(0) + depths[-50:].count(1) == 50


def test_the_depth_rises_again_when_drafts_start_to_land() -> None:
    policy = DepthPolicy(3)
    run(policy, 150, [0.0, 0.0, 0.0], draft_s=0.05, verify_s=gpu_like)
    assert policy.depth == 0
    depths = run(policy, 300, [0.95, 0.95, 0.95], draft_s=0.05, verify_s=gpu_like, seed=1)
    assert set(depths[-50:]) == {3}


def test_the_rule_compares_expected_tokens_per_second() -> None:
    policy = DepthPolicy(3)
    policy.accept = [0.8, 0.5, 0.5]
    policy.draft_step_s = 0.1
    policy.verify_s = {1: 1.0, 2: 1.1, 3: 1.2, 4: 1.3}
    assert policy.expected_tokens(2) == pytest.approx(1 + 0.8 + 0.4)
    assert policy.step_cost(2) == pytest.approx(0.2 + 1.2)
    assert policy.rate(2) == pytest.approx(2.2 / 1.4)
    policy.accept = [0.8, None, None]  # positions never drafted: assumed like the one before
    assert policy.expected_tokens(3) == pytest.approx(1 + 0.8 + 0.64 + 0.512)


def test_below_the_maximum_a_step_probes_one_deeper_after_waits_that_double() -> None:
    policy = DepthPolicy(3, probe_every=16)
    policy.depth = 1
    policy.accept = [0.9, 0.1, 0.1]
    policy.draft_step_s, policy.verify_s = 0.1, {1: 1.0, 2: 1.3, 3: 1.6, 4: 1.9}
    depths = []
    for _ in range(115):
        depths.append(policy.next_depth())
        policy.observe(depths[-1], 1, 0.1 * depths[-1], policy.verify_s[depths[-1] + 1])
    assert [i for i, d in enumerate(depths) if d == 2] == [16, 49, 114] and policy.depth == 1


def test_unmeasured_verify_batches_are_extrapolated() -> None:
    policy = DepthPolicy(3)
    assert policy.verify_cost(2) is None
    policy.verify_s = {4: 2.0}
    assert policy.verify_cost(2) == pytest.approx(1.0)  # one point: proportional to the rows
    policy.verify_s = {3: 1.5, 4: 1.6}
    assert policy.verify_cost(1) == pytest.approx(1.3)  # two points: the line through them
    assert policy.verify_cost(2) == pytest.approx(1.4)


def test_a_fixed_depth_never_moves() -> None:
    policy = DepthPolicy(2, adaptive=False)
    assert set(run(policy, 50, [0.0, 0.0], draft_s=1.0, verify_s=cpu_like)) == {2}


def test_an_untimed_step_updates_acceptance_but_not_the_draft_cost() -> None:
    policy = DepthPolicy(3)
    policy.observe(3, 1, None, 1.0)  # e.g. the first step after a prompt, whose NextN pass caught it up
    assert policy.draft_step_s is None and policy.verify_s == {4: 1.0}
    assert policy.accept[0] > policy.prior_acceptance > policy.accept[1] and policy.accept[2] is None


def test_a_probe_ceiling_below_the_first_wait_is_refused() -> None:
    with pytest.raises(GenerationError, match="probe_max 8 is below probe_every 16"):
        DepthPolicy(3, probe_every=16, probe_max=8)


def test_depth_outside_one_to_three_is_refused() -> None:
    for bad in (0, 4):
        with pytest.raises(GenerationError, match="draft depth"):
            DepthPolicy(bad)


def test_an_untimed_verify_batch_leaves_its_cost_alone() -> None:
    """A graph's warm-up or capture (verify_s None) is not what the batch costs once replayed."""
    policy = DepthPolicy(3)
    policy.observe(3, 3, 0.3, 1.0)
    policy.observe(3, 3, 0.3, None)
    assert policy.verify_s == {4: 1.0} and policy.accept[0] > 0.5
