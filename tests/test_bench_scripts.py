"""The measurement scripts (no timings asserted): bench_serve's token counting and /metrics attribution against
a live server, ab's alternation and ratios, h2h_llama's commands for both arms, and bench_offload's decode
graph setting in its record."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_server_harness import serve_model

ROOT = Path(__file__).resolve().parent.parent


def _script(name: str):
    return importlib.import_module(f"scripts.bench.{name}")


def _run(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"scripts.bench.{name}", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_bench_serve_counts_token_ids_and_attributes_metrics_to_each_request(synth_model, tmp_path) -> None:
    path = synth_model("glm4moe")
    out = tmp_path / "bench.json"
    with serve_model(path, n_ctx=256) as (url, _):
        done = _run("bench_serve", "--url", url, "--prompt-tokens", "24", "--gen", "6", "--runs", "5", "--warmup", "1",
                    "--seed", "3", "--out", str(out))
    assert done.returncode == 0, done.stderr
    r = json.loads(out.read_text())
    assert len(r["runs"]) == 5 and r["warmups_discarded"] == 1 and r["server"]["props"]["model"] == path.stem
    for run in r["runs"]:
        assert run["prompt_tokens"] == 24 and run["completion_tokens"] == 6
        assert run["server"]["completion_tokens"] == 6 and run["server"]["prompt_tokens"] == 24
        assert run["timings"]["cached_n"] == 0  # the nonce made every prompt cold
        assert run["client"]["ttft_s"] >= run["server"]["ttft_s"] > 0
    s = r["summary"]["client.ttft_s"]
    assert s["n"] == 5 and s["min"] <= s["median"] <= s["max"]
    assert r["environment"]["python"] and "commit" in r["environment"]


def _chunk(ids, text="x", **extra):
    return {"choices": [{"text": text, "token_ids": ids, "finish_reason": None}], **extra}


def test_bench_serve_refuses_figures_it_cannot_trust() -> None:
    bench = _script("bench_serve")
    usage = {"choices": [], "usage": {"completion_tokens": 2, "prompt_tokens": 5}}
    ok = [(1.0, _chunk([7])), (2.0, _chunk([8])), (2.1, _chunk([], "")), (2.2, usage)]
    metrics = {"runner_generations_total": 1.0, "runner_completion_tokens_total": 2.0}
    got = bench._figures(ok, 0.5, {}, metrics, 5)
    assert got["completion_tokens"] == 2 and got["client"]["ttft_s"] == 0.5 and got["client"]["decode_tok_s"] == 1.0
    with pytest.raises(bench.BenchError, match="moved by 2.0 during one request"):
        bench._figures(ok, 0.5, {}, {**metrics, "runner_generations_total": 2.0}, 5)
    with pytest.raises(bench.BenchError, match="counted 2 token ids and 5 prompt tokens, usage says 3"):
        bench._figures(ok[:3] + [(2.2, {"choices": [], "usage": {"completion_tokens": 3, "prompt_tokens": 5}})], 0.5,
                       {}, metrics, 5)
    with pytest.raises(bench.BenchError, match="text arrived without token ids"):
        bench._figures([(1.0, _chunk([], "hello")), *ok], 0.5, {}, metrics, 5)


def test_ab_alternates_fresh_processes_and_reports_ratios(tmp_path) -> None:
    out = tmp_path / "ab.json"
    a = f"{sys.executable} -c \"import json; print(json.dumps({{'t': {{'s': 2.0}}}}))\""
    b = f"{sys.executable} -c \"import json, sys; open(sys.argv[1], 'w').write(json.dumps({{'t': {{'s': 3.0}}}}))\" {{out}}"
    done = _run("ab", "--a", a, "--b", b, "--metric", "t.s", "--rounds", "5", "--warmup", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    r = json.loads(out.read_text())
    c = r["comparison"]["t.s"]
    assert c["ratio_b_over_a"] == 1.5 and c["a"]["n"] == c["b"]["n"] == 5 and c["pair_ratios"]["min"] == 1.5
    assert r["warmups_discarded"] == 1 and len(r["runs"]["a"]) == 5 and "B/A 1.500" in done.stdout
    bad = _run("ab", "--a", a, "--b", a, "--metric", "t.missing", "--rounds", "5", "--warmup", "0", "--out", str(out))
    assert bad.returncode == 1 and bad.stderr.strip().splitlines() == [  # at the first run, not after every round
        "error: no figure 't.missing' in the arm's JSON (missing 'missing')"]


FAKE_BENCH = """import json, sys
a = sys.argv[1:]
n, ub, r = int(a[a.index("-n") + 1]), int(a[a.index("-ub") + 1]), int(a[a.index("-r") + 1])
lengths = [int(v) for v in a[a.index("-p" if n == 0 else "-d") + 1].split(",")] if n == 0 or "-d" in a else [0]
tests = []
for length in lengths:  # one test per length, as llama-bench runs -p 2048,8192; pp slower for longer prompts
    ts = (1000.0 if ub == 2048 else 500.0) * 2048 / max(length, 2048) if n == 0 else 20.0
    tests.append({"n_prompt": length if n == 0 else 0, "n_gen": n, "n_depth": 0 if n == 0 else length,
                  "avg_ts": ts, "samples_ts": [ts] * r})
print(json.dumps(tests))
"""
FAKE_RUNNER = """import json, sys
a = sys.argv[1:]
lengths = sorted(int(a[i + 1]) for i, v in enumerate(a) if v == "--prompt-tokens")
runs = [{"prompt_tokens": n, "prefill_tok_s": 750.0 * 2048 / n, "ttft_s": n / 750.0, "decode_tok_s": 30.0,
         "uploaded_expert_sets": 1.0} for n in lengths for _ in range(int(a[a.index("--repeat") + 1]))]
json.dump({"prompt": {"tokens": lengths[0]}, "prefill_tok_s": 750.0, "ttft_s": 2.0, "decode": {"decode_tok_s": 30.0},
           "prefill": {"uploaded_expert_sets": 1.0}, "runs": runs}, open(a[a.index("--json") + 1], "w"))
"""


def _fake_tools(tmp_path: Path, runner_code: str = FAKE_RUNNER) -> tuple[Path, Path]:
    """A fake llama-bench (executable) and a fake `runner` script in tmp_path."""
    bench, runner = tmp_path / "llama-bench", tmp_path / "runner.py"
    bench.write_text(f"#!{sys.executable}\n{FAKE_BENCH}")
    bench.chmod(0o755)
    runner.write_text(runner_code)
    return bench, runner


def test_h2h_runs_both_arms_and_records_the_commands_as_run(tmp_path) -> None:
    bench, runner = _fake_tools(tmp_path)
    out = tmp_path / "h2h.json"
    done = _run("h2h_llama", "model.gguf", "--llama-bench", str(bench), "--runner", f"{sys.executable} {runner}",
                "--prompt-tokens", "2048", "--gen", "32", "--out", str(out))
    assert done.returncode == 0, done.stderr
    r = json.loads(out.read_text())
    cmds = r["commands"]
    assert set(cmds) == {f"llama.cpp {s} ub{u} {t}" for s in ("ot-exps-cpu", "n-cpu-moe") for u in (512, 2048)
                         for t in ("pp", "tg")} | {"ours home-24g"}
    assert "-ot exps=CPU" in cmds["llama.cpp ot-exps-cpu ub512 pp"] and "-ub 512" in cmds["llama.cpp ot-exps-cpu ub512 pp"]
    assert "--n-cpu-moe 99" in cmds["llama.cpp n-cpu-moe ub2048 tg"] and "-d 2048" in cmds["llama.cpp n-cpu-moe ub2048 tg"]
    assert "--profile home-24g" in cmds["ours home-24g"] and "--prompt-tokens 2048" in cmds["ours home-24g"]
    assert all(len(v) == 5 for v in r["commands_as_run"].values())
    assert "{out}" not in json.dumps(r["commands_as_run"])
    ratios = r["ratios"]
    assert ratios["ours home-24g / llama.cpp ot-exps-cpu ub512 pp prefill_tok_s"] == 1.5
    assert ratios["ours home-24g / llama.cpp n-cpu-moe ub2048 pp prefill_tok_s"] == 0.75
    assert ratios["ours home-24g / llama.cpp ot-exps-cpu ub512 tg decode_tok_s"] == 1.5


def test_h2h_tg_only_runs_no_llama_prompt_arm_and_still_compares_decode(tmp_path) -> None:
    bench, runner = _fake_tools(tmp_path)
    out = tmp_path / "h2h.json"
    common = ["h2h_llama", "model.gguf", "--llama-bench", str(bench), "--runner", f"{sys.executable} {runner}",
              "--styles", "ot-exps-cpu", "--ubatch", "2048", "--out", str(out)]
    done = _run(*common, "--tg-only")
    assert done.returncode == 0, done.stderr
    r = json.loads(out.read_text())
    assert set(r["commands"]) == {"llama.cpp ot-exps-cpu ub2048 tg", "ours home-24g"}
    assert set(r["ratios"]) == {"ours home-24g / llama.cpp ot-exps-cpu ub2048 tg decode_tok_s"}
    done = _run(*common, "--tg-only", "--pp-only")
    assert done.returncode != 0 and "--pp-only and --tg-only" in done.stderr


def test_h2h_starts_an_arm_with_its_own_runner_for_an_ab_in_the_same_rounds(tmp_path) -> None:
    """--ours-runner LABEL=CMD: that arm's processes start with CMD (a patched copy of the tree), alternated with
    the others'; a label that names no arm is refused before anything runs."""
    bench, runner = _fake_tools(tmp_path)
    other = tmp_path / "other.py"
    other.write_text(FAKE_RUNNER.replace("750.0", "1500.0"))
    out = tmp_path / "h2h.json"
    args = ["h2h_llama", "model.gguf", "--llama-bench", str(bench), "--runner", f"{sys.executable} {runner}",
            "--styles", "none", "--ours", "base=--cache-slots 150", "--ours", "patched=--cache-slots 150",
            "--rounds", "3", "--repeats", "2", "--out", str(out)]
    done = _run(*args, "--ours-runner", f"patched={sys.executable} {other}")
    assert done.returncode == 0, done.stderr
    r = json.loads(out.read_text())
    assert str(other) in r["commands"]["ours patched"] and str(other) not in r["commands"]["ours base"]
    assert [f["prefill_tok_s"] for f in r["figures"]["ours patched"]] == [1500.0] * 6
    assert [f["prefill_tok_s"] for f in r["figures"]["ours base"]] == [750.0] * 6
    refused = _run(*args[:-2], "--out", str(tmp_path / "x.json"), "--ours-runner", "typo=python3 x.py")
    assert refused.returncode != 0 and "--ours-runner names no --ours arm: typo" in refused.stderr


def test_h2h_says_whether_each_arm_generated_the_first_arms_tokens_run_by_run(tmp_path) -> None:
    """Our processes' token digests (profile's tokens_sha256, a run each) go into the record; `same_tokens` holds,
    per arm, whether every process matched the first arm's digests in order, and the run says so per arm."""
    runner = tmp_path / "digests.py"  # argv[1] names the arm: its runs' digests
    runner.write_text("""import json, sys
label, a = sys.argv[1], sys.argv[2:]
digests = {"a": ["d0", "d1"], "b": ["d0", "d1"], "c": ["d0", "dX"]}[label]
runs = [{"prompt_tokens": 2048, "prefill_tok_s": 750.0, "ttft_s": 2.0, "decode_tok_s": 30.0,
         "uploaded_expert_sets": 1.0, "tokens_sha256": d} for d in digests]
json.dump({"prompt": {"tokens": 2048}, "runs": runs}, open(a[a.index("--json") + 1], "w"))
""")
    bench, _ = _fake_tools(tmp_path)
    out = tmp_path / "h2h.json"
    arms = [("a", "--cache-slots 150"), ("b", "--cache-slots 150"), ("c", "--cache-slots 150")]
    args = ["h2h_llama", "model.gguf", "--llama-bench", str(bench), "--styles", "none", "--rounds", "3",
            "--repeats", "2", "--out", str(out)]
    for label, flags in arms:
        args += ["--ours", f"{label}={flags}", "--ours-runner", f"{label}={sys.executable} {runner} {label}"]
    done = _run(*args)
    assert done.returncode == 0, done.stderr
    r = json.loads(out.read_text())
    assert r["generated_tokens"]["ours b"] == [["d0", "d1"]] * 3
    assert r["same_tokens"] == {"ours a": True, "ours b": True, "ours c": False}
    assert "ours b: the same tokens as ours a, run by run" in done.stdout
    assert "ours c: tokens that DIFFER from ours a, run by run" in done.stdout


def test_h2h_runs_several_prompt_lengths_in_each_process_and_pairs_ratios_by_length(tmp_path) -> None:
    """--prompt-tokens 8192,2048: llama-bench gets -p 2048,8192 (and tg -d the same), our profile both lengths;
    the summary has one row per arm and length, and a ratio only pairs rows of the same length."""
    bench, runner = _fake_tools(tmp_path)
    out = tmp_path / "h2h.json"
    done = _run("h2h_llama", "model.gguf", "--llama-bench", str(bench), "--runner", f"{sys.executable} {runner}",
                "--styles", "ot-exps-cpu", "--ubatch", "2048", "--prompt-tokens", "8192,2048", "--rounds", "3",
                "--repeats", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    r = json.loads(out.read_text())
    assert "-p 2048,8192" in r["commands"]["llama.cpp ot-exps-cpu ub2048 pp"]
    assert "-d 2048,8192" in r["commands"]["llama.cpp ot-exps-cpu ub2048 tg"]
    assert "--prompt-tokens 2048 --prompt-tokens 8192" in r["commands"]["ours home-24g"]
    rows = {label: fig["n"] for label, figs in r["summary"].items() for fig in list(figs.values())[:1]}
    assert rows == {f"{arm} @{n}": 6 for arm in ("llama.cpp ot-exps-cpu ub2048 pp", "llama.cpp ot-exps-cpu ub2048 tg",
                                                 "ours home-24g") for n in (2048, 8192)}
    assert r["summary"]["ours home-24g @8192"]["prefill_tok_s"]["median"] == 187.5
    ratios = r["ratios"]
    assert ratios["ours home-24g @2048 / llama.cpp ot-exps-cpu ub2048 pp @2048 prefill_tok_s"] == 0.75
    assert ratios["ours home-24g @8192 / llama.cpp ot-exps-cpu ub2048 pp @8192 prefill_tok_s"] == 0.75
    assert ratios["ours home-24g @8192 / llama.cpp ot-exps-cpu ub2048 tg @8192 decode_tok_s"] == 1.5
    assert not [k for k in ratios if "@2048 /" in k and "@8192 " in k]


def test_h2h_stops_before_a_process_that_would_pass_its_budget_and_resumes(tmp_path) -> None:
    """--budget-s: a process is not started when its arm's longest one would end past the budget (the record
    says incomplete); --resume runs only what is missing, keeps what ran, and refuses a record that is complete."""
    # ours takes 4 s a process, so that a budget of 8 s holds round 0 and llama.cpp's round 1 even where a
    # loaded machine starts Python slowly (about 1 s each), and never ours' round 1
    bench, runner = _fake_tools(tmp_path, "import time\ntime.sleep(4)\n" + FAKE_RUNNER)
    out = tmp_path / "h2h.json"
    common = ["h2h_llama", "model.gguf", "--llama-bench", str(bench), "--runner", f"{sys.executable} {runner}",
              "--styles", "ot-exps-cpu", "--ubatch", "2048", "--pp-only", "--rounds", "3", "--repeats", "2",
              "--out", str(out)]
    done = _run(*common, "--budget-s", "8")
    assert done.returncode == 0, done.stderr
    first = json.loads(out.read_text())
    assert not first["complete"] and len(first["commands_as_run"]["ours home-24g"]) == 1
    assert "stopped before round 1 of ours home-24g" in done.stderr
    assert first["seconds"]["ours home-24g"][0] >= 4
    done = _run(*common, "--resume")
    assert done.returncode == 0, done.stderr
    r = json.loads(out.read_text())
    assert r["complete"] and all(len(v) == 3 for v in r["commands_as_run"].values())
    assert r["commands_as_run"]["ours home-24g"][0] == first["commands_as_run"]["ours home-24g"][0]
    assert r["summary"]["ours home-24g"]["ttft_s"]["n"] == 6 and len(r["seconds"]["ours home-24g"]) == 3
    done = _run(*common, "--resume")
    assert done.returncode != 0 and "is complete; give a new --out" in done.stderr


def test_h2h_counts_every_repetition_of_a_process_as_a_run(tmp_path) -> None:
    """--rounds 3 --repeats 2: three processes an arm, each measuring twice (llama-bench -r 2, profile --repeat 2),
    six runs in each arm's summary; fewer than 3 processes or 5 runs is refused."""
    bench, runner = _fake_tools(tmp_path)
    out = tmp_path / "h2h.json"
    common = ["h2h_llama", "model.gguf", "--llama-bench", str(bench), "--runner", f"{sys.executable} {runner}",
              "--styles", "ot-exps-cpu", "--ubatch", "2048", "--pp-only", "--out", str(out)]
    done = _run(*common, "--rounds", "3", "--repeats", "2", "--keep-reports", str(tmp_path / "kept"))
    assert done.returncode == 0, done.stderr
    kept = sorted(p.name for p in (tmp_path / "kept").iterdir())
    assert kept == [f"{arm}-round{i}.json" for arm in ("llama.cpp-ot-exps-cpu-ub2048-pp", "ours-home-24g")
                    for i in range(3)]
    assert len(json.loads((tmp_path / "kept" / "ours-home-24g-round0.json").read_text())["runs"]) == 2
    r = json.loads(out.read_text())
    assert all(len(v) == 3 for v in r["commands_as_run"].values())
    assert "-r 2" in r["commands"]["llama.cpp ot-exps-cpu ub2048 pp"] and "--repeat 2" in r["commands"]["ours home-24g"]
    assert r["summary"]["ours home-24g"]["ttft_s"]["n"] == r["summary"]["llama.cpp ot-exps-cpu ub2048 pp"]["prefill_tok_s"]["n"] == 6
    assert r["ratios"]["ours home-24g / llama.cpp ot-exps-cpu ub2048 pp prefill_tok_s"] == 0.75
    assert r["complete"] is True
    for rounds, repeats in (("2", "3"), ("4", "1")):
        bad = _run(*common, "--rounds", rounds, "--repeats", repeats)
        assert bad.returncode == 2 and "at least 3 processes an arm and at least 5 runs" in bad.stderr


def test_h2h_keeps_the_processes_that_ran_when_a_later_one_fails(tmp_path) -> None:
    """The record is written after every process (`complete` false until the end), so a call stopped by its
    time limit, or a process that fails, leaves the rounds that ran."""
    count = tmp_path / "count"
    bench, runner = _fake_tools(tmp_path, f"""import pathlib, sys
c = pathlib.Path({str(count)!r}); n = int(c.read_text()) if c.exists() else 0; c.write_text(str(n + 1))
if n == 1:
    sys.exit("out of memory")
{FAKE_RUNNER}""")
    out = tmp_path / "h2h.json"
    done = _run("h2h_llama", "model.gguf", "--llama-bench", str(bench), "--runner", f"{sys.executable} {runner}",
                "--styles", "ot-exps-cpu", "--ubatch", "2048", "--pp-only", "--rounds", "3", "--repeats", "2",
                "--out", str(out))
    assert done.returncode == 1 and "out of memory" in done.stderr
    r = json.loads(out.read_text())
    assert r["complete"] is False
    assert {k: len(v) for k, v in r["commands_as_run"].items()} == {"llama.cpp ot-exps-cpu ub2048 pp": 2,
                                                                    "ours home-24g": 1}
    assert r["summary"]["ours home-24g"]["ttft_s"]["n"] == 2
    assert r["ratios"]["ours home-24g / llama.cpp ot-exps-cpu ub2048 pp prefill_tok_s"] == 0.75


@pytest.mark.parametrize("eager", [True, False])
def test_bench_offload_decode_records_whether_decode_ran_in_graphs(synth_model, tmp_path, eager: bool) -> None:
    out = tmp_path / "decode.json"
    done = _run("bench_offload", "decode", str(synth_model("glm4moe")), "--backend", "numpy", "--slots", "2",
                "--contexts", "16", "--tokens", "5", "--runs", "1", "--vram-budget", "1", "--ubatch", "16",
                "--server-ubatch", "16", "--out", str(out), *(["--eager"] if eager else []))
    assert done.returncode == 0, done.stderr
    r = json.loads(out.read_text())
    assert r["decode_graphs"] == ("off" if eager else "none (numpy backend)")  # numpy has no graphs to run
    assert r["environment"]["argv"]["eager"] == str(eager)
    # the shared record (runner.environment) with the script's arguments added
    assert {"host", "platform", "python", "numpy", "gpu", "commit", "dirty"} <= set(r["environment"])
    figures = r["contexts"]["16"]
    assert figures["steady_decode_tok_s"]["n"] == figures["decode_tok_s"]["n"] == figures["first_two_steps_ms"]["n"] == 1
    assert figures["first_two_steps_ms"]["median"] > 0
    assert "segments" not in figures  # reported only where segmented graphs replayed
    # a prompt the cost model runs through the cache (which one does depends on the measured decode step)
    # is counted apart from decode's lookups, with its bytes when there was one
    through = figures["prompts_through_cache"]
    assert through in (0, 1) and ("prompt_through_cache_bytes" in figures) == (through == 1)


def test_bench_host_step_records_per_policy_timings_and_the_timed_steps_counters(tmp_path) -> None:
    out = tmp_path / "host_step.json"
    done = _run("bench_host_step", "--experts", "32", "--k", "4", "--layers", "2", "--slots", "12", "--tokens", "20",
                "--warmup", "10", "--runs", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    r = json.loads(out.read_text())
    assert set(r["policies"]) == {"lru", "lfu"}
    for figures in r["policies"].values():
        assert figures["host_step_us"]["n"] == 1 and figures["host_step_excl_uploads_us"]["median"] > 0
        c = figures["timed_counters"]
        assert c["hits"] + c["misses"] == 20 * 2 * 4 and c["evictions"] > 0  # every pair of the timed steps


def test_prefill_ops_counts_every_op_a_streamed_prompt_calls(synth_model, tmp_path) -> None:
    """The numpy backend's prompt through the op brackets: each layer's ops counted, host time per op, no GPU
    figures (no events) and no syncs to count."""
    out = tmp_path / "ops.json"
    done = _run("prefill_ops", str(synth_model("glm4moe")), "--backend", "numpy", "--tokens", "40", "--ubatch", "16",
                "--slots", "2", "--vram-budget", "1", "--runs", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    r = json.loads(out.read_text())
    (run,) = r["runs"]
    ops, layers, chunks = run["ops"], r["layers"], 3  # 40 tokens in micro-batches of 16
    assert ops["rope_neox"]["calls"] == 2 * layers * chunks and ops["embed"]["calls"] == chunks  # q and k
    assert ops["attention"]["calls"] >= layers * chunks and ops["moe"]["calls"] >= 1
    assert all(v["gpu_s"] is None and v["host_s"] > 0 for v in ops.values())
    assert run["ops_gpu_s"] is None and run["wall_s"] >= ops["attention"]["host_s"]
    assert not any(k.startswith("sync") or "." in k for k in ops)
    # groups: the top-level calls in order, one closed by each moe call, then the trailing ones (final norm, output)
    groups = run["groups"]
    assert sum(g["moe"] is not None for g in groups) == ops["moe"]["calls"] and groups[-1]["moe"] is None
    assert all(g["moe"] is None or g["host_s"] >= g["moe"]["host_s"] for g in groups)
    assert sum(g["host_s"] for g in groups) <= run["wall_s"] and "pool_grow_bytes" not in groups[0]
    assert run["pool_bytes"] == {"before": None, "after": None}


class _FakeCupy:
    """Just what Brackets reads of cupy: events stamped by a clock the bracketed calls advance, and a pool size."""

    def __init__(self) -> None:
        self.clock_ms, self.pool_total = 0.0, 0
        fake = self

        class Event:
            def record(self, stream=None) -> None:
                self.ms = fake.clock_ms

        class Device:
            def synchronize(self) -> None:
                pass

        class Pool:
            def total_bytes(self) -> int:
                return fake.pool_total

        pool = Pool()

        self.cuda = type("cuda", (), {"Event": Event, "Device": Device,
                                      "get_current_stream": staticmethod(lambda: None),
                                      "get_elapsed_time": staticmethod(lambda a, b: b.ms - a.ms)})
        self.get_default_memory_pool = lambda: pool

    def work(self, ms: float, grow: int) -> None:
        self.clock_ms += ms
        self.pool_total += grow


def test_prefill_ops_pool_watch_counts_the_allocations_that_resize_the_pool() -> None:
    """A pool at its limit frees its cached blocks before each malloc: little net growth, every allocation a change."""
    from scripts.bench.prefill_ops import Brackets, PoolWatch

    cp = _FakeCupy()
    cached = {"bytes": 0}

    def malloc(size: int) -> int:
        if size <= cached["bytes"]:
            cached["bytes"] -= size  # a cached block serves it: no cudaMalloc
        else:  # at the limit: the cached blocks are freed, then size is malloc'd
            cp.work(0.0, size - cached["bytes"])
            cached["bytes"] = 0
        return size

    def malloc_and_free(size: int) -> None:
        watch.malloc(size)
        cached["bytes"] += size  # freed by the op: the pool keeps the block

    cp.get_default_memory_pool().malloc = malloc
    watch = PoolWatch(cp)
    b = Brackets(cuda=cp, watch=watch)
    reuse = b.wrap("reuse", lambda: malloc_and_free(100))
    churn = b.wrap("churn", lambda: (malloc_and_free(150), malloc_and_free(200)))
    reuse()  # a cudaMalloc of 100
    reuse()  # served from the cache
    churn()  # 100 freed, 150 malloc'd; 150 freed, 200 malloc'd
    ops = b.figures()
    assert (ops["reuse"]["calls"], ops["reuse"]["pool_changes"], ops["reuse"]["pool_grow_bytes"]) == (2, 1, 100)
    assert (ops["churn"]["pool_changes"], ops["churn"]["pool_grow_bytes"]) == (2, 100) and watch.changes == 3
    assert [g["pool_changes"] for g in b.group_figures()] == [3]  # no moe call: one open group


def test_prefill_ops_brackets_file_gpu_time_and_pool_growth_by_op_and_by_group() -> None:
    from scripts.bench.prefill_ops import Brackets

    cp = _FakeCupy()
    b = Brackets(cuda=cp)
    linear = b.wrap("linear", lambda: cp.work(1.0, 100))
    dense = b.wrap("moe.dense", lambda: cp.work(2.0, 10))
    moe = b.wrap("moe", lambda: (dense(), cp.work(5.0, 1000)))
    for step in (linear, moe, linear, linear, moe, linear):
        step()
    ops = b.figures()
    assert {k: (v["calls"], v["pool_grow_bytes"]) for k, v in ops.items()} == {
        "linear": (4, 400), "moe": (2, 2020), "moe.dense": (2, 20)}  # the nested part counts in its parent too
    assert ops["moe"]["gpu_s"] == pytest.approx(0.014) and ops["linear"]["gpu_s"] == pytest.approx(0.004)
    groups = b.group_figures()
    assert [(g["calls"], g["pool_grow_bytes"]) for g in groups] == [(2, 1110), (3, 1210), (1, 100)]
    assert [g["gpu_s"] for g in groups] == pytest.approx([0.008, 0.009, 0.001])
    assert groups[0]["moe"]["gpu_s"] == pytest.approx(0.007) and groups[0]["moe"]["pool_grow_bytes"] == 1010
    assert 0 < groups[0]["moe"]["host_s"] <= groups[0]["host_s"] and groups[2]["moe"] is None
    b.clear()
    assert b.figures() == {} and b.group_figures() == []


def test_brackets_lead_runs_before_each_top_level_call_only() -> None:
    """decode_ops --queue-ahead-us: the spin goes before a top-level op's start event, so the op's events do not
    time it; a nested op (inside its parent's events already) gets none."""
    from scripts.bench.prefill_ops import Brackets

    cp = _FakeCupy()
    leads: list[float] = []
    b = Brackets(cuda=cp, lead=lambda: (leads.append(cp.clock_ms), cp.work(100.0, 0)))
    inner = b.wrap("kv_store", lambda: cp.work(1.0, 0))
    outer = b.wrap("rope_kv_store", lambda: (inner(), cp.work(2.0, 0)))
    outer()
    outer()
    ops = b.figures()
    assert leads == [0.0, 103.0]  # one spin per top-level call, none for the nested one
    assert ops["rope_kv_store"]["gpu_s"] == pytest.approx(0.006) and ops["kv_store"]["gpu_s"] == pytest.approx(0.002)


def test_decode_ops_refuses_queue_ahead_without_cuda(synth_model, tmp_path) -> None:
    done = _run("decode_ops", str(synth_model("glm4moe")), "--backend", "numpy", "--queue-ahead-us", "200",
                "--out", str(tmp_path / "ops.json"))
    assert done.returncode == 2 and "--queue-ahead-us times kernels: it needs --backend cuda" in done.stderr
    assert not (tmp_path / "ops.json").exists()


@pytest.mark.parametrize("slots", ["4", "resident"])
def test_decode_ops_counts_a_tokens_ops_once_each(synth_model, tmp_path, slots: str) -> None:
    """Eager decode through the op brackets on numpy, offloaded and resident: per token one embedding, attention
    in every layer, the router and moe in every MoE layer; an op called from inside another is filed as nested,
    not summed."""
    out = tmp_path / "ops.json"
    done = _run("decode_ops", str(synth_model("glm4moe")), "--backend", "numpy", "--context", "24", "--tokens", "5",
                "--slots", slots, "--vram-budget", "1", "--runs", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    r = json.loads(out.read_text())
    (run,) = r["runs"]
    ops, layers = run["ops"], r["layers"]
    moe_layers = layers - 1  # the tiny glm4moe's first layer is dense
    assert ops["embed"]["calls"] == 1 and ops["attention"]["calls"] == layers
    assert ops["moe"]["calls"] == ops["route"]["calls"] == moe_layers
    assert ops["kv_store (nested)"]["calls"] == layers and "kv_store" not in ops  # inside numpy's rope_kv_store
    assert all(v["gpu_ms"] is None and v["host_ms"] > 0 for v in ops.values())
    assert run["ops_gpu_ms_per_token"] is None
    assert run["wall_ms_per_token"] >= sum(v["host_ms"] for k, v in ops.items() if "(nested)" not in k)


def test_bench_mtp_forced_acceptance_arms_and_synthetic_routing(tmp_path) -> None:
    out = tmp_path / "mtp.json"
    done = _run("bench_mtp", str(ROOT / "runner" / "data" / "demo.gguf"), "--backend", "numpy", "--slots", "8",
                "--runs", "1", "--context", "32", "--tokens", "12", "--routing", "locality-qwen3-30b-a3b",
                "--accept", "0,1", "--forced-depth", "2", "--out", str(out))
    assert done.returncode == 0, done.stderr  # the script asserts every arm's tokens equal plain decoding's
    r = json.loads(out.read_text())
    assert r["routing"]["synthetic"] and r["routing"]["mode"] == "locality-qwen3-30b-a3b"
    forced = r["forced_acceptance"]
    assert forced["depth"] == 2 and set(forced["arms"]) == {"forced0.0", "forced1.0"}
    assert forced["arms"]["forced0.0"]["drafts_accepted_share"] == 0.0  # every draft wrong
    assert forced["arms"]["forced1.0"]["drafts_accepted_share"] == 1.0  # every draft the main model's
    assert forced["arms"]["forced0.0"]["predicted_speedup"] < forced["arms"]["forced1.0"]["predicted_speedup"]
    assert set(r["cost_model"]) == {"1", "2", "3"}


class _FakeDriver:
    """CUgraph handle -> its nodes' CUgraphNodeType values, as libcuda would list them."""

    def __init__(self, graphs: dict[int, list[int]]) -> None:
        self.graphs, self.types = graphs, {}
        for handle, types in graphs.items():
            for i, t in enumerate(types):
                self.types[handle * 1000 + i] = t

    def nodes(self, graph: int) -> list[int]:
        return [graph * 1000 + i for i in range(len(self.graphs[graph]))]

    def node_type(self, node: int) -> int:
        return self.types[node]


def test_graph_launches_counts_the_nodes_of_every_graph_a_step_launches() -> None:
    from types import SimpleNamespace

    from scripts.bench.graph_launches import captured_graphs, describe, node_counts

    driver = _FakeDriver({1: [0, 0, 1, 5], 2: [0, 2, 7, 6], 3: [0] * 9 + [1]})
    cupy_graph = {h: SimpleNamespace(graph=h) for h in (1, 2, 3)}
    segmented = SimpleNamespace(segments=[cupy_graph[1], cupy_graph[2]], rows=1)  # SegmentedDecodeGraph's shape
    whole = SimpleNamespace(graph=cupy_graph[3], rows=2)  # DecodeGraph's (and the directory graph's)
    assert captured_graphs(segmented) == [cupy_graph[1], cupy_graph[2]] and captured_graphs(whole) == [cupy_graph[3]]
    assert captured_graphs(SimpleNamespace(graph=None)) == []  # not captured yet
    assert node_counts(captured_graphs(segmented), driver) == {
        "empty": 1, "event record": 1, "kernel": 3, "memcpy": 1, "memset": 1, "wait event": 1, "launches": 5}
    d = describe("draft", whole, driver)
    assert d == {"role": "draft", "rows": 2, "kind": "SimpleNamespace", "graphs_per_step": 1,
                 "nodes": {"kernel": 9, "memcpy": 1, "launches": 10}}
    assert describe("decode", segmented, driver)["graphs_per_step"] == 2


def test_graph_launches_refuses_the_numpy_backend_in_one_line(tmp_path) -> None:
    done = _run("graph_launches", str(ROOT / "runner" / "data" / "demo.gguf"), "--backend", "numpy", "--out",
                str(tmp_path / "g.json"))
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [
        "error: graph launches are counted on the CUDA backend only (numpy captures no graphs)"]
    assert not (tmp_path / "g.json").exists()


def test_h2h_keeps_a_decoded_tokens_gpu_and_host_split_where_the_profile_has_it() -> None:
    from scripts.bench.h2h_llama import our_figures

    run = {"prompt_tokens": 8, "ttft_s": 1.0, "prefill_tok_s": 8.0, "decode_tok_s": 100.0, "uploaded_expert_sets": 1.0,
           "decode_gpu_ms_per_token": 9.1, "decode_host_ms_per_token": 0.9}
    report = {"prompt": {"tokens": 8}, "runs": [run, {**run, "decode_gpu_ms_per_token": None,
                                                       "decode_host_ms_per_token": None}]}
    with_split, without = our_figures(report)
    assert with_split["decode_gpu_ms_per_token"] == 9.1 and with_split["decode_host_ms_per_token"] == 0.9
    assert "decode_gpu_ms_per_token" not in without and without["decode_tok_s"] == 100.0


def test_pregate_prediction_holds_each_next_layers_experts_against_a_guess_from_the_layer_before(tmp_path) -> None:
    """pregate_prediction on the demo model: every decoded token gives one guess per pair of consecutive MoE
    layers, a deeper guess covers at least as much, and the trained router's guess beats chance."""
    from runner.package_data import demo_model_path

    out = tmp_path / "pregate.json"
    run = _run("pregate_prediction", str(demo_model_path()), "--tokens", "6", "--extra", "0,2", "--out", str(out))
    assert run.returncode == 0, run.stderr
    got = json.loads(out.read_text())
    assert got["layer_pairs"] == (got["moe_layers"] - 1) * (got["decoded_tokens"] - 1)
    shares = [got["covered"]["top_k+0"], got["covered"]["top_k+2"]]
    assert got["chance"] < shares[0] <= shares[1] <= 1.0
    # the guess's first k right, counted per guess, is the share of the k actual ones it covers
    assert got["precision_of_first"][str(got["top_k"])] == shares[0]
