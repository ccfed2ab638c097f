"""scripts/bench/decode_arms_cuda's arms on the CPU (its timings run on the GPU box): parsing NAME=PATH=VALUE lists,
resolving module and class constants (a misspelt one is refused, not silently set), and every constant back as it
was after an arm, also when the arm's block fails."""

from __future__ import annotations

import pytest

from runner.backends.cuda import gemv as gemv_cuda
from runner.backends.cuda.token_graph import DirectoryDecodeGraph
from scripts.bench.decode_arms_cuda import ArmError, applied, parse_arm, resolve

ROUTE = "runner.backends.cuda.gemv.ROUTE_WARP_COLUMNS"
EARLY = "runner.backends.cuda.token_graph.DirectoryDecodeGraph.EARLY_SERVE"


def test_an_arm_is_a_name_and_its_literal_settings() -> None:
    assert parse_arm(f"route18={ROUTE}=1, runner.backends.cuda.gemv.ROUTE_LOAD_AHEAD=8") == (
        "route18", [(ROUTE, 1), ("runner.backends.cuda.gemv.ROUTE_LOAD_AHEAD", 8)])
    assert parse_arm(f"early={EARLY}=True") == ("early", [(EARLY, True)])
    assert parse_arm("none=runner.backends.cuda.gemv.GATE_UP_MIN_BLOCKS=None")[1] == [
        ("runner.backends.cuda.gemv.GATE_UP_MIN_BLOCKS", None)]


@pytest.mark.parametrize("text", ["route18", f"main={ROUTE}=1", f"x={ROUTE}", "x=ROUTE=1", f"x={ROUTE}=one"])
def test_a_malformed_arm_is_refused(text: str) -> None:
    with pytest.raises(ArmError):
        parse_arm(text)


def test_paths_resolve_to_module_and_class_constants_that_exist() -> None:
    assert resolve(ROUTE) == (gemv_cuda, "ROUTE_WARP_COLUMNS")
    assert resolve(EARLY) == (DirectoryDecodeGraph, "EARLY_SERVE")
    with pytest.raises(ArmError, match="has no ROUTE_WARP_COLUMN"):
        resolve("runner.backends.cuda.gemv.ROUTE_WARP_COLUMN")
    with pytest.raises(ArmError, match="no module"):
        resolve("nosuchpackage.X")


def test_every_constant_comes_back_after_an_arm_even_one_that_fails() -> None:
    before = (gemv_cuda.ROUTE_WARP_COLUMNS, DirectoryDecodeGraph.EARLY_SERVE)
    with applied([(ROUTE, 1), (EARLY, not before[1])]):
        assert (gemv_cuda.ROUTE_WARP_COLUMNS, DirectoryDecodeGraph.EARLY_SERVE) == (1, not before[1])
    assert (gemv_cuda.ROUTE_WARP_COLUMNS, DirectoryDecodeGraph.EARLY_SERVE) == before
    with pytest.raises(RuntimeError), applied([(ROUTE, 1)]):
        raise RuntimeError("a failed capture")
    assert gemv_cuda.ROUTE_WARP_COLUMNS == before[0]


def test_the_numpy_dry_run_writes_every_arm_with_the_baselines_tokens(tmp_path) -> None:
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "arms.json"
    done = subprocess.run([sys.executable, "-m", "scripts.bench.decode_arms_cuda", str(root / "runner/data/demo.gguf"),
                           "--backend", "numpy", "--context", "40", "--tokens", "3", "--rounds", "2",
                           "--arm", f"route18={ROUTE}=1", "--out", str(out)],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    arms = json.loads(out.read_text())["arms"]
    assert list(arms) == ["main", "route18"] and arms["route18"]["settings"] == {ROUTE: 1}
    assert all(arm["same_tokens_as_main"] and arm["ms_per_token"]["n"] == 2 for arm in arms.values())
    assert len(arms["route18"]["ratio_to_main_by_round"]) == 2


def test_a_screen_cut_short_keeps_the_rounds_it_wrote(tmp_path, monkeypatch) -> None:
    """The record is written after every round, so a deadline that kills the screen keeps what it measured: the
    record on disk after round 1 of 3 says rounds 1, with one time an arm."""
    import json
    import sys
    from pathlib import Path

    from scripts.bench import decode_arms_cuda

    out = tmp_path / "arms.json"
    calls = {"n": 0}
    real_decode = decode_arms_cuda.decode

    def decode_then_stop(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:  # rounds 0 and 1 ran both arms (main, route18): killed as round 2 starts
            raise KeyboardInterrupt
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(decode_arms_cuda, "decode", decode_then_stop)
    monkeypatch.setattr(sys, "argv", ["decode_arms_cuda", "runner/data/demo.gguf", "--backend", "numpy", "--context",
                                      "40", "--tokens", "3", "--rounds", "3", "--arm", f"route18={ROUTE}=1",
                                      "--out", str(out)])
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    try:
        decode_arms_cuda.main()
    except KeyboardInterrupt:
        pass
    record = json.loads(out.read_text())
    assert record["rounds"] == 1 and all(arm["ms_per_token"]["n"] == 1 for arm in record["arms"].values())


def test_a_screen_needs_a_round(tmp_path) -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-m", "scripts.bench.decode_arms_cuda", "runner/data/demo.gguf", "--backend",
                           "numpy", "--rounds", "0", "--out", str(tmp_path / "a.json")],
                          cwd=root, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--rounds must be at least 1" in done.stderr
