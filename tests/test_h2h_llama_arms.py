"""scripts/bench/h2h_llama's llama-bench command lines (the runs themselves need llama.cpp and a GPU box)."""

from __future__ import annotations

import argparse

from scripts.bench.h2h_llama import llama_arms


def _args(**over) -> argparse.Namespace:
    base = dict(ubatch=[2048], styles=["ot-exps-cpu", "n-cpu-moe", "resident"], llama_bench="llama-bench",
                model="m.gguf", n_cpu_moe=99, repeats=2, llama_extra="-fa 1 -lm none", prompt_tokens=[1024],
                tg_only=True, pp_only=False, no_depth=False, gen=128)
    return argparse.Namespace(**{**base, **over})


def test_each_style_keeps_its_experts_where_it_says() -> None:
    arms = llama_arms(_args())
    assert set(arms) == {f"llama.cpp {s} ub2048 tg" for s in ("ot-exps-cpu", "n-cpu-moe", "resident")}
    ot, cpu_moe, resident = (arms[f"llama.cpp {s} ub2048 tg"] for s in ("ot-exps-cpu", "n-cpu-moe", "resident"))
    assert ot[ot.index("-ot") + 1] == "exps=CPU" and "--n-cpu-moe" not in ot
    assert cpu_moe[cpu_moe.index("--n-cpu-moe") + 1] == "99" and "-ot" not in cpu_moe
    assert "-ot" not in resident and "--n-cpu-moe" not in resident  # every layer's weights on the GPU
    for argv in arms.values():
        assert argv[argv.index("-ngl") + 1] == "99" and argv[argv.index("-d") + 1] == "1024"
        assert argv[argv.index("-n") + 1] == "128" and argv[argv.index("-p") + 1] == "0"


def test_only_the_named_styles_run() -> None:
    assert list(llama_arms(_args(styles=["resident"]))) == ["llama.cpp resident ub2048 tg"]
    both = llama_arms(_args(styles=["resident"], tg_only=False))
    assert list(both) == ["llama.cpp resident ub2048 pp", "llama.cpp resident ub2048 tg"]
