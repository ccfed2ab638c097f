"""Decode graphs through the prefill phase transaction, as ExpertOffload decides it (numpy backend, emulated ledger).

The decode reservation is two entries: "decode workspaces" (eager batches' room, released during every prompt)
and "decode graphs" (the graphs' share). The graphs and their share are kept through a prompt when the context's
longest prompt fits beside them; otherwise they are dropped around each prompt, as before, and stats say why. The
CUDA side: tests/test_decode_segments.py (the stand-in) and tests/test_graph_survival_cuda.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from test_engine_offload import answers
from test_warm_fill import N_CTX, PROMPT, _engine

from runner.backends.budget import DeviceBudget
from runner.engine.engine import Engine
from runner.errors import CacheError, PhaseError
from runner.offload.backend import decode_workspaces
from runner.offload.offload import PREFILL_BUFFERS
from runner.offload.sizing import decode_graph_bytes, decode_reservation_bytes, staging_bytes

GRAPHS, WORKSPACES = "decode graphs", "decode workspaces"


@pytest.fixture(scope="module")
def path(synth_model):
    return synth_model("glm4moe", "Q8_0")


def _held_during_prompt(engine: Engine, monkeypatch) -> dict[str, int]:
    """The ledger as the prompt left it, just before its buffers are freed (filled by the next prefill)."""
    offload, seen = engine.offload, {}
    free = offload.free_prefill_buffers
    monkeypatch.setattr(offload, "free_prefill_buffers", lambda: seen.update(offload.budget.held) or free())
    return seen


def _budget_below_kept_room(path, short_by: float) -> int:
    """A budget that leaves the context's longest prompt `short_by` of the graphs' share less room than it needs
    beside kept graphs (0.5: it fits once they are dropped; 1 and more: not even then)."""
    probe = _engine(path).offload
    need = probe._prefill_buffer_bytes(N_CTX) + staging_bytes(probe.store)
    spare = probe._prefill_room() - need
    assert spare >= 0 and probe.graphs.kept
    return probe.budget.limit_bytes - spare - int(short_by * probe.backend.graph_workspaces.nbytes)


def test_the_decode_reservation_is_the_graphs_share_and_the_rest(path) -> None:
    engine = _engine(path, cache_slots=6, decode_batch=3)
    held, cfg = engine.offload.budget.held, engine.model_config
    assert held[GRAPHS] == decode_graph_bytes(cfg, N_CTX, 3) > 0
    assert held[GRAPHS] + held[WORKSPACES] == decode_reservation_bytes(cfg, N_CTX, 3)


def test_eager_decode_reserves_no_graph_share() -> None:
    budget, cfg = DeviceBudget(1 << 30), SimpleNamespace(n_vocab=64, n_embd=32, n_head=4, head_dim=8, n_expert_used=2,
                                                        n_ff_exp=16, delta_net=None)
    eager, graphs = decode_workspaces(budget, cfg, N_CTX, 3, graphs=False)
    assert graphs is None and eager.nbytes == decode_reservation_bytes(cfg, N_CTX, 3)
    eager, graphs = decode_workspaces(budget, cfg, N_CTX, 3)
    assert graphs.what == GRAPHS and eager.nbytes + graphs.nbytes == decode_reservation_bytes(cfg, N_CTX, 3)


def test_graphs_are_kept_through_a_prompt_that_fits_beside_their_share(path, monkeypatch) -> None:
    engine = _engine(path)
    during = _held_during_prompt(engine, monkeypatch)
    for _ in range(2):
        engine.prefill(PROMPT)
        engine.decode(3)
    offload = engine.offload
    assert offload.backend.graphs.invalidations == 0  # never dropped
    assert offload.backend.graphs.restores == 2  # the step runs; it has nothing to redo
    assert GRAPHS in during and PREFILL_BUFFERS in during and WORKSPACES not in during
    assert {GRAPHS, WORKSPACES} <= set(offload.budget.held) and PREFILL_BUFFERS not in offload.budget.held
    s = engine.stats()
    assert s["graphs"] == {"kept": True, "why_dropped": None, "drops": 0, "held_bytes": 0}
    assert s["phase"]["ends"] == 2 and s["healthy"] and s["budget"]["peak_bytes"] <= s["budget"]["limit_bytes"]


def test_a_budget_without_room_beside_them_drops_the_graphs_around_each_prompt(path, monkeypatch) -> None:
    limit = _budget_below_kept_room(path, 0.5)
    engine = _engine(path, vram_budget_bytes=limit)
    during = _held_during_prompt(engine, monkeypatch)
    engine.prefill(PROMPT)
    engine.prefill(PROMPT)
    offload = engine.offload
    assert not offload.graphs.kept and offload.graphs.drops == 2 == offload.backend.graphs.invalidations
    assert "decode graphs dropped around each prompt" in offload.graphs.why_dropped
    assert GRAPHS not in during and WORKSPACES not in during and PREFILL_BUFFERS in during
    assert {GRAPHS, WORKSPACES} <= set(offload.budget.held)  # restored for decode
    assert offload.budget.peak_bytes <= limit and engine.stats()["healthy"]


def test_a_budget_without_room_even_dropping_them_refuses_the_context_in_one_line(path) -> None:
    with pytest.raises(CacheError, match="prefill buffers for --prefill-ubatch 8 at context 128 need") as err:
        _engine(path, vram_budget_bytes=_budget_below_kept_room(path, 1.01))
    assert "\n" not in str(err.value)


def test_a_failed_prompt_drops_even_kept_graphs_and_reset_restores_both_reservations(path) -> None:
    engine = _engine(path)
    with pytest.raises(PhaseError, match="step 'prompt': kernel fault"):
        engine.prefill(PROMPT, cancelled=answers(False, RuntimeError("kernel fault")))
    engine.reset()
    offload = engine.offload
    assert offload.backend.graphs.invalidations == 1 and offload.graphs.kept  # recaptured by the next steps
    assert {GRAPHS, WORKSPACES} <= set(offload.budget.held) and PREFILL_BUFFERS not in offload.budget.held
    assert engine.prefill(PROMPT) is not None and offload.backend.graphs.invalidations == 1
