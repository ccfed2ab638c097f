"""The loading bar: the host expert arena reports its bytes as it fills, and the CLI draws them (with the rate) on
stderr only when stderr is a terminal."""

from __future__ import annotations

import io
import itertools
import json
import re
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
from click.testing import CliRunner
from gguf.constants import GGMLQuantizationType as QT

from runner.cli import progress as progress_module
from runner.cli.main import main
from runner.cli.progress import arena_progress
from runner.engine.engine import Engine, EngineConfig
from runner.gguf_file import TensorInfo
from runner.models.weights import MoEWeights
from runner.offload.host_store import MATRIX_ALIGN, HostExpertStore
from runner.offload.offload import OffloadConfig

OFFLOAD = ["--cache-slots", "3", "--prefill-ubatch", "8", "--ubatch", "8", "-n", "2", "--temperature", "0",
           "--backend", "numpy"]


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _q8_experts(layer: int, n_expert: int, rows: int) -> MoEWeights:
    """Q8_0 experts of `rows` rows of one 34-byte block: with odd rows a matrix ends off MATRIX_ALIGN, so the
    arena holds padding the file does not."""
    rng = np.random.default_rng(layer)

    def tensor(kind: str) -> TensorInfo:
        data = rng.integers(0, 256, (n_expert, rows, 34), dtype=np.uint8)
        return TensorInfo(f"blk.{layer}.ffn_{kind}_exps.weight", QT.Q8_0, (n_expert, rows, 32), data, 0)

    return MoEWeights(None, None, tensor("gate"), tensor("up"), tensor("down"), None)  # type: ignore[arg-type]


def _record(seen: list[tuple[int, int]]):
    return lambda done, total: seen.append((done, total))


def test_the_arena_reports_rising_byte_counts_that_end_at_its_size_padding_included() -> None:
    layers = [SimpleNamespace(ffn=_q8_experts(i, n_expert=5, rows=3)) for i in (1, 2)]
    seen: list[tuple[int, int]] = []
    store = HostExpertStore(SimpleNamespace(layers=layers, nextn=()), progress=_record(seen))
    assert store.expert_bytes(1) % MATRIX_ALIGN == 0 and store.expert_bytes(1) > 3 * 3 * 34  # padded
    done = [d for d, _ in seen]
    assert seen[0] == (0, store.expert_set_bytes) and {t for _, t in seen} == {store.expert_set_bytes}
    assert all(b > a for a, b in itertools.pairwise(done)) and done[-1] == store.expert_set_bytes == store.arena.nbytes


def test_the_arena_is_pinned_once_after_the_bar_has_counted_the_fill() -> None:
    events: list[str] = []

    def pin(array: np.ndarray) -> Callable[[], None]:
        events.append("pin")
        return lambda: None

    layers = [SimpleNamespace(ffn=_q8_experts(1, n_expert=2, rows=3))]
    store = HostExpertStore(SimpleNamespace(layers=layers, nextn=()), pin, lambda done, total: events.append(str(done)))
    assert events[0] == "0" and events[-2:] == [str(store.expert_set_bytes), "pin"] and events.count("pin") == 1


def test_an_offloading_engine_hands_the_arena_progress_to_its_caller(synth_model) -> None:
    seen: list[tuple[int, int]] = []
    engine = Engine.load(synth_model("glm4moe", "Q8_0"), EngineConfig(n_ctx=64, offload=OffloadConfig(cache_slots=3)),
                         arena_progress=_record(seen))
    done = [d for d, _ in seen]
    assert done[0] == 0 and all(b > a for a, b in itertools.pairwise(done))
    assert done[-1] == engine.offload.store.expert_set_bytes == engine.offload.store.arena.nbytes > 0


def test_on_a_terminal_the_bar_shows_bytes_and_rate_and_ends_its_line() -> None:
    term = FakeTerminal()
    with arena_progress(term) as report:
        assert report is not None
        for done in (0, 250_000_000, 500_000_000, 1_000_000_000):
            report(done, 1_000_000_000)
    text = term.getvalue()
    assert "filling the host expert arena" in text and "100%" in text
    assert re.search(r"1\.0 GB of 1\.0 GB, [\d.]+ [kMG]?B/s", text) and text.endswith("\n")


def test_a_bar_cut_short_by_an_error_still_ends_its_line() -> None:
    term = FakeTerminal()
    try:
        with arena_progress(term) as report:
            report(0, 100)
            report(40, 100)
            raise MemoryError("host out of memory")
    except MemoryError:
        pass
    assert "40%" in term.getvalue() and term.getvalue().endswith("\n")


def test_off_a_terminal_there_is_no_bar() -> None:
    with arena_progress(io.StringIO()) as report:
        assert report is None


def test_generate_keeps_stdout_json_and_stderr_clean_off_a_terminal(synth_model) -> None:
    out = CliRunner().invoke(main, ["generate", str(synth_model("glm4moe", "Q8_0")), "-p", "hi", *OFFLOAD, "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["finish_reason"] == "length"
    assert [line.split(":")[0] for line in out.stderr.splitlines()] == ["launch"]  # the launch line, no bar


def test_generate_draws_the_bar_on_a_terminal_stderr_and_leaves_stdout_alone(synth_model, monkeypatch) -> None:
    term = FakeTerminal()
    monkeypatch.setattr(progress_module, "stderr_stream", lambda: term)
    out = CliRunner().invoke(main, ["generate", str(synth_model("glm4moe", "Q8_0")), "-p", "hi", *OFFLOAD, "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["tokens"] and "arena" not in out.stdout
    assert "filling the host expert arena" in term.getvalue() and "100%" in term.getvalue()
