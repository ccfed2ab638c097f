"""`runner profile` on a synthesized model: byte figures equal the analytic ones and `runner info`'s expert
set, the JSON, the table and the plot agree, and the numpy backend says its timings are not GPU timings."""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from runner.cli.info import model_info
from runner.cli.main import main
from runner.gguf_file import open_gguf

PROMPT_TOKENS, UBATCH, GEN = 40, 8, 4


@pytest.fixture(scope="module")
def path(synth_model) -> Path:
    return synth_model("glm4moe", "Q8_0")


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("prompt") / "doc.txt"
    p.write_text("Routed experts live in host memory and stream to the card layer by layer. ")
    return p


def _profile(path: Path, prompt_file: Path, tmp_path: Path, *extra: str) -> tuple[str, dict]:
    out_json = tmp_path / "profile.json"
    result = CliRunner().invoke(main, ["profile", str(path), "--prompt-file", str(prompt_file), "--prompt-tokens",
                                       str(PROMPT_TOKENS), "--gen", str(GEN), "--prefill-ubatch", str(UBATCH),
                                       "--transaction", "always", "--cache-slots", "3", "--backend", "numpy",
                                       "--json", str(out_json), *extra])
    assert result.exit_code == 0, result.output
    return result.output, json.loads(out_json.read_text())


def _streamed_set_bytes(path: Path) -> int:
    info = model_info(open_gguf(path))
    n_layer = info.config["n_layer"]
    return sum(b for layer, b in info.routed_expert_bytes_per_layer.items() if layer < n_layer)


@pytest.mark.parametrize("order,crossings", [("layer_major", 1), ("per_microbatch", math.ceil(PROMPT_TOKENS / UBATCH))])
def test_prefill_bytes_are_the_analytic_expert_sets_of_runner_infos_layers(path, prompt_file, tmp_path, order,
                                                                           crossings) -> None:
    _, r = _profile(path, prompt_file, tmp_path, "--prefill-order", order)
    set_bytes = _streamed_set_bytes(path)
    p = r["prefill"]
    assert r["prompt"] == {"tokens": PROMPT_TOKENS, "new_tokens": PROMPT_TOKENS}
    assert p["expert_set_bytes"] == set_bytes and p["path"] == "phase transaction"
    assert p["stream_bytes"] == crossings * set_bytes and p["expert_sets"] == crossings
    assert p["per_microbatch_would_bytes"] == math.ceil(PROMPT_TOKENS / UBATCH) * set_bytes
    assert p["layer_major_would_bytes"] == set_bytes
    info = model_info(open_gguf(path))
    assert r["model"]["routed_set_bytes_in_file"] == info.routed_expert_bytes
    assert r["model"]["routed_bytes_not_streamed"] == info.routed_expert_bytes - set_bytes  # the NextN block's
    for row in p["per_layer"]:
        assert row["bytes"] == crossings * info.routed_expert_bytes_per_layer[row["layer"]] and row["visits"] == crossings
    # Warm refill: 3 slots in each of the 2 streamed layers, one expert each.
    assert p["warm_bytes"] == 2 * 3 * r["model"]["expert_bytes"] and p["bytes"] == p["stream_bytes"] + p["warm_bytes"]
    copies = [s for s in r["timeline"] if s["stream"] == "copy"]
    assert len(copies) == 2 * crossings


def test_decode_counts_every_routed_lookup_and_the_phase_times(path, prompt_file, tmp_path) -> None:
    _, r = _profile(path, prompt_file, tmp_path)
    d, ph = r["decode"], r["phase"]
    assert d["tokens"] == GEN and d["decoded_tokens"] == GEN - 1
    assert d["hits"] + d["misses"] == (GEN - 1) * 2 * 2  # decode passes x MoE layers x top-2
    assert d["bytes_per_token"] == d["miss_bytes"] / (GEN - 1) and "no real routing locality" in d["note"]
    assert d["graph_replays"] == 0 and d["gpu_ms_per_token"] is None  # numpy: no graphs to time
    assert ph["ran"] and ph["release_s"] >= 0 and ph["restore_s"] >= 0 and ph["warm_experts"] == 6


def test_each_run_reports_a_digest_of_its_generated_tokens(path, prompt_file, tmp_path) -> None:
    """decode.tokens_sha256 and each run's: SHA-256 of the greedy ids, so another process (another build) of the
    same prompts can be compared to the token; the same command gives the same digests."""
    from runner.cli.profile_report import tokens_digest

    assert tokens_digest([1, 2, 3]) == hashlib.sha256(b"1,2,3").hexdigest()
    _, first = _profile(path, prompt_file, tmp_path, "--warmup", "0", "--repeat", "2")
    _, again = _profile(path, prompt_file, tmp_path, "--warmup", "0", "--repeat", "2")
    digests = [r["tokens_sha256"] for r in first["runs"]]
    assert all(re.fullmatch("[0-9a-f]{64}", d) for d in digests) and digests[0] == first["decode"]["tokens_sha256"]
    assert tokens_digest([]) not in digests  # the ids reached the report
    assert [r["tokens_sha256"] for r in again["runs"]] == digests


def test_temperature_samples_from_the_seed_and_the_report_says_so(path, prompt_file, tmp_path) -> None:
    """--temperature T --seed S decodes by sampling: the same seed, the same tokens; another seed or greedy,
    others; the JSON names the sampling."""
    _, greedy = _profile(path, prompt_file, tmp_path, "--gen", "12")
    _, one = _profile(path, prompt_file, tmp_path, "--gen", "12", "--temperature", "1.5", "--seed", "1")
    _, again = _profile(path, prompt_file, tmp_path, "--gen", "12", "--temperature", "1.5", "--seed", "1")
    _, other = _profile(path, prompt_file, tmp_path, "--gen", "12", "--temperature", "1.5", "--seed", "2")
    assert greedy["sampling"] == "greedy" and one["sampling"] == {"temperature": 1.5, "seed": 1}
    digest = one["decode"]["tokens_sha256"]
    assert again["decode"]["tokens_sha256"] == digest
    assert digest not in (greedy["decode"]["tokens_sha256"], other["decode"]["tokens_sha256"])


def test_the_table_json_and_plot_agree_and_numpy_timings_are_labelled(path, prompt_file, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    from PIL import Image

    png = tmp_path / "timeline.png"
    table, r = _profile(path, prompt_file, tmp_path, "--plot", str(png))
    p, t = r["prefill"], r["timing"]
    assert f"streamed   {p['stream_bytes']} B" in table and f"= {p['expert_sets']:.3f} expert sets" in table
    assert f"the prompt routed to {p['routed_share_of_set']:.1%} of the set's bytes" in table
    assert 0 < p["routed_share_of_set"] <= 1 and p["routed_bytes"] == sum(
        row["routed_experts"] * r["model"]["expert_bytes"] for row in p["per_layer"])
    assert f"time to first token {r['ttft_s']:.4f} s" in table
    assert f"per_microbatch would stream {p['per_microbatch_would_bytes']} B" in table
    total = re.search(r"^total +(\d+) +(\d+) +([\d.]+) +(\d+) +([\d.]+) +([\d.]+) +([\d.]+)$", table, re.M)
    assert total and int(total[2]) == p["stream_bytes"] and int(total[4]) == p["per_microbatch_would_bytes"]
    assert float(total[5]) == pytest.approx(t["copy_s"], abs=1e-4)
    assert float(total[7]) == pytest.approx(t["upload_wait_s"], abs=1e-4)
    assert "not GPU timings" in table and not t["gpu_timings"] and "not GPU timings" in t["clock"]
    assert r["environment"]["python"] and r["launch"]["offload"]["cache_slots"] == 3
    assert r["launch"]["backend"]["kv_type"] == "f16" and "K/V cache f16" in table
    described = json.loads(Image.open(png).text["Description"])
    assert described == {"ttft_s": r["ttft_s"], "stream_bytes": p["stream_bytes"], "expert_sets": p["expert_sets"],
                         "copy_s": t["copy_s"], "compute_s": t["compute_s"], "overlap_s": t["overlap_s"],
                         "spans": len(r["timeline"])}


def test_plot_without_matplotlib_is_a_one_line_error_before_any_work(path, prompt_file, tmp_path,
                                                                     monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    result = CliRunner().invoke(main, ["profile", str(path), "--prompt-file", str(prompt_file), "--backend", "numpy",
                                       "--plot", str(tmp_path / "x.png")])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == ["error: --plot needs matplotlib: pip install 'moe-offload-runner[plot]'"]


@pytest.mark.parametrize("args,message", [
    (["--no-offload"], "error: runner profile measures expert offload; --no-offload leaves nothing to measure"),
    (["--prompt-file", "/nonexistent/doc.txt"], "error: cannot read the prompt file /nonexistent/doc.txt"),
])
def test_bad_profile_input_is_one_line(path, prompt_file, args, message) -> None:
    base = ["profile", str(path), "--backend", "numpy"]
    if "--prompt-file" not in args:
        base += ["--prompt-file", str(prompt_file)]
    result = CliRunner().invoke(main, base + args)
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert result.output.startswith(message)


def test_warm_up_prompts_run_first_and_stay_out_of_the_report(path, prompt_file, tmp_path) -> None:
    """--warmup 2: two prompts of other ids run before the measured one, whose figures are a cold prompt's
    (no reused prefix, one crossing) and whose phase counters count only it."""
    table, warm = _profile(path, prompt_file, tmp_path, "--warmup", "2")
    _, cold = _profile(path, prompt_file, tmp_path)
    assert warm["warmup_prompts"] == 2 and cold["warmup_prompts"] == 0
    assert warm["prompt"] == cold["prompt"] == {"tokens": PROMPT_TOKENS, "new_tokens": PROMPT_TOKENS}
    assert warm["prefill"]["stream_bytes"] == cold["prefill"]["stream_bytes"] == _streamed_set_bytes(path)
    assert warm["offload_stats"]["phase"]["begins"] == 3 and cold["offload_stats"]["phase"]["begins"] == 1
    assert warm["decode"]["decoded_tokens"] == cold["decode"]["decoded_tokens"]
    assert "after 2 warm-up prompt(s)" in table


def test_repeat_measures_cold_prompts_in_one_process(path, prompt_file, tmp_path) -> None:
    """--repeat 3: three measured prompts of distinct ids, each a cold prompt of its own (one crossing of the
    expert set, no reused prefix); the report's figures are the first's."""
    _, r = _profile(path, prompt_file, tmp_path, "--warmup", "1", "--repeat", "3")
    runs = r["runs"]
    assert len(runs) == 3 and runs[0]["ttft_s"] == r["ttft_s"]
    assert all(x["stream_bytes"] == _streamed_set_bytes(path) and x["uploaded_expert_sets"] > 0 for x in runs)
    assert all(x["prefill_tok_s"] > 0 and x["decode_tok_s"] > 0 and x["link_idle_s"] >= 0 for x in runs)
    assert r["offload_stats"]["phase"]["begins"] == 4  # the warm-up and three measured prompts


def test_several_lengths_run_shortest_first_in_one_process_each_cold(path, prompt_file, tmp_path) -> None:
    """--prompt-tokens given twice (longer first on the command line): the shorter length's warm-up and measured
    prompts run first, then the longer's, every one cold (one crossing, nothing reused); the headline is the
    shorter's first measured prompt, and the context fits the longer."""
    out_json = tmp_path / "lengths.json"
    result = CliRunner().invoke(main, ["profile", str(path), "--prompt-file", str(prompt_file), "--prompt-tokens", "48",
                                       "--prompt-tokens", "24", "--gen", str(GEN), "--prefill-ubatch", str(UBATCH),
                                       "--transaction", "always", "--cache-slots", "3", "--backend", "numpy",
                                       "--warmup", "1", "--repeat", "2", "--json", str(out_json)])
    assert result.exit_code == 0, result.output
    r = json.loads(out_json.read_text())
    assert [x["prompt_tokens"] for x in r["runs"]] == [24, 24, 48, 48]
    assert r["prompt"]["tokens"] == 24 and r["ttft_s"] == r["runs"][0]["ttft_s"]
    assert all(x["stream_bytes"] == _streamed_set_bytes(path) for x in r["runs"])
    assert r["offload_stats"]["phase"]["begins"] == 6  # a warm-up and two measured prompts per length
    assert r["launch"]["n_ctx"] == 48 + GEN
    assert result.output.count("prompt tokens: time to first token") == 4


def test_every_prompt_of_a_process_has_its_own_ids(path, prompt_file) -> None:
    """The warm-ups and measured prompts of every length share no more than their first token, so no prefix
    cache could answer one from another."""
    from runner.cli import profile as profile_module

    seen: list[list[int]] = []
    engine = _RecordingEngine(seen)
    for shift, n in ((0, 24), (3, 48)):
        tokens = list(range(5, 5 + n))
        profile_module.warm_up(engine, tokens, 1, None, 2, first_shift=shift)
        seen.append(profile_module.shifted(tokens, 1000, shift + 2))
    firsts = {tuple(p[1:3]) for p in seen}
    assert len(seen) == 6 and len(firsts) == 6


class _RecordingEngine:
    """Just enough of Engine for warm_up: records each prompt's ids."""

    def __init__(self, seen: list[list[int]]):
        self.seen, self.model_config = seen, type("Cfg", (), {"n_vocab": 1000})()

    def generate(self, tokens, *args, **kwargs):
        self.seen.append(list(tokens))
        return type("Gen", (), {"run": lambda self: None})()

    def reset(self) -> None:
        pass


def test_warm_fill_staging_reports_the_warm_bytes_as_device_to_device(path, prompt_file, tmp_path) -> None:
    _, host = _profile(path, prompt_file, tmp_path)
    table_staged, staged = _profile(path, prompt_file, tmp_path, "--warm-fill", "staging")
    p, s = host["prefill"], staged["prefill"]
    assert p["warm_bytes"] > 0 and p["warm_device_bytes"] == 0 and p["warm_fill"]["mode"] == "host"
    assert (s["warm_bytes"], s["warm_device_bytes"]) == (0, p["warm_bytes"])
    assert s["warm_fill"]["staged"] == 1 and s["warm_fill"]["fallbacks"] == 0
    assert s["bytes"] == s["stream_bytes"] == p["stream_bytes"]  # nothing crosses the link for the warm slots
    assert staged["phase"]["warm_experts"] == host["phase"]["warm_experts"]
    assert f"{p['warm_bytes']} B warm fill from staging" in table_staged


def test_a_staging_fill_that_did_not_fit_says_why_in_the_table(path, prompt_file, tmp_path) -> None:
    """A budget that holds the prompt's staging and buffers but not the slots beside them (6 MiB on this model):
    the warm slots cross the link, and the table says why instead of leaving the bytes to be explained."""
    table, r = _profile(path, prompt_file, tmp_path, "--warm-fill", "staging", "--vram-budget", str(6 / 1024))
    p = r["prefill"]
    assert p["warm_fill"]["fallbacks"] >= 1 and p["warm_bytes"] > 0 and p["warm_device_bytes"] == 0
    assert re.search(r"warm fill  not all from staging: the 3-slot cache needs [\d.]+ MiB beside the prompt's "
                     r"staging and buffers, [\d.]+ [KM]iB free", table)
    _, roomy = _profile(path, prompt_file, tmp_path, "--warm-fill", "staging")
    assert roomy["prefill"]["warm_fill"]["fallbacks"] == 0


def test_link_idle_is_the_time_between_uploads_the_link_spent_waiting(path, prompt_file, tmp_path) -> None:
    """timing.link_idle_s: from the first upload's start to the last one's end, the time no upload ran (the
    H200 timelines' gaps between layers); on numpy's wall clock the emulated uploads run back to back or not,
    and the figure agrees with the spans either way."""
    from runner.cli.profile_report import ProfileRun, _timing
    from runner.offload.timeline import Span

    spans = [Span("copy", 1, "visit 0", 0.0, 1.0), Span("copy", 2, "visit 1", 1.5, 2.0),
             Span("copy", 3, "visit 2", 2.0, 3.0), Span("compute", 1, "visit 0", 0.5, 1.6)]
    run = ProfileRun(8, 8, 3.5, 2, 0.1, {}, {}, {}, spans=spans)
    t = _timing(run, {"clock": "test"}, 3_000)
    assert t["copy_s"] == pytest.approx(2.5) and t["link_idle_s"] == pytest.approx(0.5)
    table, r = _profile(path, prompt_file, tmp_path)
    copies = sorted((s["start_s"], s["end_s"]) for s in r["timeline"] if s["stream"] == "copy")
    assert r["timing"]["link_idle_s"] == pytest.approx(copies[-1][1] - copies[0][0] - r["timing"]["copy_s"])
    assert f"link idle {r['timing']['link_idle_s']:.4f} s" in table


def test_compute_busy_is_the_compute_spans_less_their_waits_for_uploads(path, prompt_file, tmp_path) -> None:
    """A link-bound prompt's compute spans are mostly waits for the next layer's upload; compute_busy_s leaves
    them out (issue 19's kernel seconds), per layer too, and every run of a process carries its own split."""
    from runner.cli.profile_report import ProfileRun, _timing
    from runner.offload.timeline import Span

    spans = [Span("copy", 1, "visit 0", 0.0, 1.0), Span("compute", 1, "visit 0", 0.2, 1.3),
             Span("wait", 1, "visit 0", 0.4, 1.0), Span("wait", 1, "visit 0", 0.9, 1.0),  # a second fetch, waits overlap
             Span("copy", 2, "visit 1", 1.0, 2.0), Span("compute", 2, "visit 1", 1.3, 2.5),
             Span("wait", 2, "visit 1", 1.3, 2.0)]
    t = _timing(ProfileRun(8, 8, 2.6, 2, 0.1, {}, {}, {}, spans=spans), {"clock": "test"}, 2_000)
    assert t["compute_s"] == pytest.approx(2.3) and t["upload_wait_s"] == pytest.approx(1.3)
    assert t["compute_busy_s"] == pytest.approx(1.0)
    assert [row["wait_s"] for row in t["per_layer"]] == pytest.approx([0.7, 0.7])  # summed as recorded
    table, r = _profile(path, prompt_file, tmp_path, "--prompt-tokens", "9", "--prompt-tokens", "12")
    waits = [s for s in r["timeline"] if s["stream"] == "wait"]
    assert waits and {s["layer"] for s in waits} == {row["layer"] for row in r["prefill"]["per_layer"]}
    t = r["timing"]
    assert 0 <= t["upload_wait_s"] <= t["compute_s"] and t["compute_busy_s"] == pytest.approx(t["compute_s"] - t["upload_wait_s"])
    assert f"{t['upload_wait_s']:.4f} s of it waiting for uploads, {t['compute_busy_s']:.4f} s not: kernels and host gaps" in table
    assert [run["prompt_tokens"] for run in r["runs"]][:2] == [9, 12]
    assert r["runs"][0]["compute_busy_s"] == t["compute_busy_s"] and all(run["copy_s"] > 0 for run in r["runs"])


def test_the_report_splits_the_load_into_the_host_arenas_fill_and_pinning(path, prompt_file, tmp_path) -> None:
    """The load of a large file takes tens of seconds; the report says how much of it the host expert arena's
    copy from the file and its pinning (on CUDA) took."""
    _, r = _profile(path, prompt_file, tmp_path)
    load = r["load"]
    assert load["host_arena_pinned"] is False  # numpy's arena is pageable
    assert load["fill_s"] > 0 and load["pin_s"] >= 0
    assert load["fill_s"] + load["pin_s"] < load["s"]


def test_a_decoded_token_splits_into_its_graphs_gpu_time_and_the_rest() -> None:
    """decode.gpu_ms_per_token: the replays' GPU time over the decoded tokens; host_ms_per_token: the wall time
    left (issue 20's host time a token). None without whole-step graph replays (numpy, eager, segments)."""
    from runner.cli.profile_report import ProfileRun, _decode

    dec = {"cache_hits": 1, "cache_misses": 1, "cache_hit_rate": 0.5, "cache_miss_bytes": 4}
    d = _decode(ProfileRun(8, 8, 1.0, 5, 0.1, {}, {}, {}, replay_gpu_ms=[10.0, 20.0, 30.0, 15.0]), dec)
    assert d["graph_replays"] == 4 and d["gpu_ms_per_token"] == pytest.approx(75.0 / 4)
    assert d["host_ms_per_token"] == pytest.approx((100.0 - 75.0) / 4)
    d = _decode(ProfileRun(8, 8, 1.0, 5, 0.1, {}, {}, {}), dec)
    assert d["graph_replays"] == 0 and d["gpu_ms_per_token"] is None and d["host_ms_per_token"] is None


class _ReplayingOps:
    """A CUDA-like ops: each decode step after the first token replays a graph that records its GPU time."""

    def __init__(self):
        self.replay_times_ms = None

    def replay(self, ms: float) -> None:
        if self.replay_times_ms is not None:
            self.replay_times_ms.append(ms)


class _Generation:
    """Generation's steps as the engine runs them: the prompt, on_prefilled, then the decode steps, each replayed
    before the token it chose is yielded, or (`ahead`: a greedy chain) before the token before it is."""

    def __init__(self, ops: _ReplayingOps, n: int, ahead: bool):
        self.ops, self.n, self.cached_tokens, self.tokens, self.decode_s, self.draft = ops, n, 0, [], 0.05, None
        self.ahead, self.on_prefilled = ahead, None

    def steps(self):
        from types import SimpleNamespace

        self.ops.replay(99.0)  # the prompt: not a decode replay, and not yet timed
        if self.on_prefilled is not None:
            self.on_prefilled()
        for i in range(self.n):
            if i + self.ahead < self.n and (i or self.ahead):
                self.ops.replay(2.0)  # the decode step choosing token i (i + 1 ahead)
            self.tokens.append(i)
            yield SimpleNamespace(token=i)


@pytest.mark.parametrize("ahead", [False, True])
def test_profile_run_times_only_the_decodes_replays_and_stops_timing_after(ahead: bool) -> None:
    from runner.cli.profile import profile_run

    ops = _ReplayingOps()
    engine = type("E", (), {"ops": ops, "stats": lambda self: {},
                            "generate": lambda self, *a, **k: _Generation(ops, 5, ahead)})()
    run = profile_run(engine, [1, 2, 3], 5, None)
    assert run.replay_gpu_ms == [2.0] * 4 and ops.replay_times_ms is None
