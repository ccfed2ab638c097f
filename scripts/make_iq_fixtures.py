"""Write tests/data/iq/: tiny MoE models whose IQ and TQ blocks llama.cpp's own tools wrote.

Each fixture is a random-weight model (`runner synth`'s writer, a cut-down tiny shape whose rows are
256 wide, so every IQ type applies) exported as F32, then quantized by `llama-quantize` to one file
type, with an importance matrix from `llama-imatrix` (over runner/synth/corpus.txt) where the type's
tensors demand one (llama-quant.cpp's tensor_requires_imatrix: IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
IQ3_XXS; llama-quantize refuses them without). `manifest.json` records the tools' version, each file's
tensor types, llama.cpp's greedy continuation of the test prompt and its top-2 margins (through
llama-cpp-python, so the GPU test needs no llama.cpp) and any type llama-quantize refused, with its
message. Takes about 2.5 minutes on 2 cores, most of it llama-imatrix and the oracle.

Build the two tools CPU-only from llama-cpp-python's sdist (vendor/llama.cpp), then:

    cmake -B build -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF
    cmake --build build --target llama-quantize llama-imatrix -j2
    python -m scripts.make_iq_fixtures --tools build/bin [--out tests/data/iq]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

from runner.synth.presets import PRESETS, SynthShape
from runner.synth.writer import write_synthetic

PROMPT = "The quick brown fox jumps over the lazy dog. Offloading experts"  # tests/test_llama_parity.py's
N_GREEDY = 32
SEED = 11
CORPUS = Path(__file__).resolve().parents[1] / "runner" / "synth" / "corpus.txt"
# Types whose tensors llama-quantize will not write without an importance matrix; IQ2_M is the file type
# whose tensors are IQ2_S.
IMATRIX_TYPES = {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS"}

# The tiny presets cut down to keep the committed files small (300-600 KB each): 320 tokens (61 merges),
# 4 experts; qwen3moe 1 layer, glm4moe 2 (1 dense + 1 MoE) and no NextN block. Every matrix row stays
# 256 or 512 wide.
SHAPES: dict[str, SynthShape] = {
    "qwen3moe": dataclasses.replace(PRESETS["qwen3moe"]["tiny"], n_vocab=320, n_layer=1, n_expert=4),
    "glm4moe": dataclasses.replace(PRESETS["glm4moe"]["tiny"], n_vocab=320, n_layer=2, n_expert=4, n_nextn=0),
}


@dataclass(frozen=True)
class Fixture:
    arch: str
    ftype: str  # llama-quantize's file type: its own mix of tensor types
    tensor_types: tuple[str, ...] = ()  # --tensor-type NAME=TYPE overrides on top of the mix
    label: str = ""

    @property
    def name(self) -> str:
        return f"{self.arch}-{self.label or self.ftype}"


FIXTURES = [
    # One file type each; llama.cpp's IQ2_S file type keeps its experts in IQ2_XS, IQ2_M puts them in IQ2_S.
    *(Fixture("qwen3moe", t) for t in ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_M", "IQ3_XXS", "IQ3_S",
                                       "TQ1_0", "TQ2_0")),
    # glm4moe: all nine types in one file, each tensor class in another (the rest in the mix's choices).
    Fixture("glm4moe", "IQ2_XXS", ("ffn_gate_exps=iq1_s", "ffn_up_exps=iq1_m", "ffn_down_exps=iq2_xs",
                                   "ffn_gate_shexp=iq2_s", "ffn_up_shexp=tq1_0", "ffn_down_shexp=tq2_0",
                                   "attn_q=iq3_xxs", "attn_output=iq3_s"), "mix"),
]


class FixtureError(Exception):
    pass


def run_tool(args: list[str], cwd: Path) -> str:
    """Run a llama.cpp tool in `cwd`; its log (stderr and stdout). Raises FixtureError with the log's error lines."""
    done = subprocess.run(args, capture_output=True, text=True, check=False, cwd=cwd)
    log = done.stdout + done.stderr
    if done.returncode != 0:
        error = re.compile(r"error|failed|invalid|unsupported", re.IGNORECASE)
        errors = [line for line in log.splitlines() if error.search(line)]
        raise FixtureError(" | ".join(errors[-3:]) or log.strip().splitlines()[-1])
    return log


def tools_version(tools: Path) -> str:
    """The tools' --version line ('version: 0.5.0-dev (build 0, commit unknown)' from an sdist, which has no
    git history); llama-imatrix answers it, llama-quantize does not."""
    done = subprocess.run([str(tools / "llama-imatrix"), "--version"], capture_output=True, text=True, check=False)
    return (done.stdout + done.stderr).strip().splitlines()[0]


def tensor_types(path: Path) -> dict[str, str]:
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}


def oracle_greedy(path: Path) -> tuple[list[int], list[int], list[float]]:
    """The prompt's tokens (our tokenizer), llama.cpp's greedy continuation (f32 K/V, as the parity tests run
    it) and llama.cpp's top-2 logit margin at each position that chose a continuation token."""
    from runner.engine.engine import Engine, EngineConfig
    from runner.parity.llama_oracle import LlamaOracle

    prompt = Engine.load(path, EngineConfig(n_ctx=256)).tokenizer.encode(PROMPT)
    with LlamaOracle(path, n_ctx=256, kv_type="f32") as oracle:
        greedy = oracle.greedy(prompt, N_GREEDY)
        logits = oracle.logits(prompt + greedy)[len(prompt) - 1 : -1]  # [N_GREEDY, n_vocab]
    top2 = np.sort(logits, axis=-1)[:, -2:]
    return prompt, greedy, [round(float(m), 4) for m in top2[:, 1] - top2[:, 0]]


def make(tools: Path, out: Path, threads: int) -> dict:
    import llama_cpp  # the oracle's version, for the manifest

    out.mkdir(parents=True, exist_ok=True)
    manifest: dict = {"llama_tools": tools_version(tools), "llama_cpp_python": llama_cpp.__version__,
                      "seed": SEED, "prompt": PROMPT, "fixtures": {}, "refused": {}}
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        shutil.copy(CORPUS, tmp / CORPUS.name)
        for arch, shape in SHAPES.items():
            # Names relative to tmp: llama-quantize writes the imatrix's and the text's paths into the file.
            f32, imatrix = f"{arch}-F32.gguf", f"{arch}-imatrix.gguf"
            write_synthetic(tmp / f32, arch, shape, lambda t: QT.F32, SEED)
            run_tool([str(tools / "llama-imatrix"), "-m", f32, "-f", CORPUS.name, "-o", imatrix,
                      "-c", "128", "-b", "128", "--chunks", "32", "-t", str(threads), "--no-ppl"], tmp)
            for fx in (f for f in FIXTURES if f.arch == arch):
                dst = out / f"{fx.name}.gguf"
                types = [fx.ftype, *(t.split("=")[1].upper() for t in fx.tensor_types)]
                args = [str(tools / "llama-quantize")]
                if IMATRIX_TYPES.intersection(types):
                    args += ["--imatrix", imatrix]
                for override in fx.tensor_types:
                    args += ["--tensor-type", override]
                try:
                    run_tool(args + [f32, str(dst.resolve()), fx.ftype, str(threads)], tmp)
                except FixtureError as exc:
                    dst.unlink(missing_ok=True)
                    manifest["refused"][fx.name] = str(exc)
                    print(f"{fx.name}: refused: {exc}", file=sys.stderr)
                    continue
                prompt, greedy, margins = oracle_greedy(dst)
                manifest["fixtures"][fx.name] = {
                    "file": dst.name, "arch": arch, "ftype": fx.ftype, "tensor_type_overrides": list(fx.tensor_types),
                    "imatrix": "--imatrix" in args, "bytes": dst.stat().st_size,
                    "tensor_types": dict(sorted(Counter(tensor_types(dst).values()).items())),
                    "prompt_tokens": prompt, "llama_greedy": greedy, "llama_top2_margin": margins,
                }
                print(f"{fx.name}: {dst.stat().st_size:,} bytes", file=sys.stderr)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tools", type=Path, required=True, help="folder holding llama-quantize and llama-imatrix")
    ap.add_argument("--out", type=Path, default=Path("tests/data/iq"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    for tool in ("llama-quantize", "llama-imatrix"):
        if not (args.tools / tool).is_file():
            sys.exit(f"error: no {tool} in {args.tools}")
    manifest = make(args.tools.resolve(), args.out, args.threads)
    total = sum(f["bytes"] for f in manifest["fixtures"].values())
    print(f"wrote {len(manifest['fixtures'])} files ({total:,} bytes) to {args.out}; "
          f"{len(manifest['refused'])} refused")


if __name__ == "__main__":
    try:
        main()
    except FixtureError as exc:
        sys.exit(f"error: {exc}")
