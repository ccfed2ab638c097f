"""Write the trained demo model (weights-*.npz from scripts/demo/train_demo.py) as a glm4moe GGUF.

Uses the synthesized models' writer pieces: the same tensor plan, metadata and vocabulary keys as
`runner synth` writes for glm4moe (runner/synth/writer.py), with the demo's own vocabulary
(vocab.json from scripts/demo/build_corpus.py) in place of the synthetic one. The NextN block's
embed_tokens and shared_head_head are left out: they were tied to the trunk's token_embd and output
in training, and both llama.cpp (TENSOR_NOT_REQUIRED) and the runner (weights.py) fall back to
those. Q8_0 is written directly (gguf.quants.quantize); norms, biases and the router stay F32.

    python3 -m scripts.demo.export_demo --weights DIR --vocab .demo/vocab.json --out demo-q8_0.gguf [--quant Q8_0|F32]

The shipped runner/data/demo.gguf is that Q8_0 file requantized to Q5_K_S by scripts/demo/quantize_gguf.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT

from runner.synth.presets import SynthShape
from runner.synth.vocab import VocabSpec, write_vocab
from runner.synth.writer import PlannedTensor, tensor_plan, write_metadata

ARCH = "glm4moe"
SHARED_WITH_TRUNK = ("nextn.embed_tokens.weight", "nextn.shared_head_head.weight")
NAME = "moe-offload-runner demo: glm4moe + NextN trained on Debian package metadata"


def load_weights(folder: Path) -> tuple[dict[str, np.ndarray], dict]:
    arrays: dict[str, np.ndarray] = {}
    for path in sorted(folder.glob("weights-*.npz")):
        with np.load(path) as z:
            arrays.update({k: z[k] for k in z.files})
    meta = json.loads(arrays.pop("__meta__").tobytes())
    return arrays, meta


def synth_shape(shape: dict) -> SynthShape:
    fields = {f.name for f in dataclasses.fields(SynthShape)}
    if shape.get("rms_eps", 1e-5) != 1e-5:
        raise SystemExit("the glm4moe writer stores rms eps 1e-5; the model was trained with another")
    return SynthShape(**{k: v for k, v in shape.items() if k in fields})


def load_vocab(path: Path, weights: Path) -> VocabSpec:
    """The vocabulary, checked against the one the training data was tokenized with (its eval.json)."""
    run = weights / "eval.json"
    trained_on = (json.loads(run.read_text()).get("data") or {}).get("vocab_sha256") if run.exists() else None
    if trained_on is not None and trained_on != hashlib.sha256(path.read_bytes()).hexdigest():
        raise SystemExit(f"{path} is not the vocabulary the training data was tokenized with: rebuild the corpus "
                         f"as the run's eval.json 'data' says, or pass the right --vocab")
    return VocabSpec(**json.loads(path.read_text()))


def demo_plan(shape: SynthShape) -> list[PlannedTensor]:
    return [t for t in tensor_plan(ARCH, shape) if not t.name.endswith(SHARED_WITH_TRUNK)]


def stored_type(t: PlannedTensor, quant: QT) -> QT:
    # As the synthesized Q8_0 files (and llama.cpp's quantizer) do: 1-D tensors and the router stay F32.
    return QT.F32 if len(t.shape) == 1 or t.kind == "router" else quant


def export(weights: dict[str, np.ndarray], shape: SynthShape, vocab: VocabSpec, out: Path, quant: QT,
           step: int) -> int:
    """Write the GGUF; returns its size in bytes."""
    plan = demo_plan(shape)
    missing = {t.name for t in plan} ^ set(weights)
    if missing:
        raise SystemExit(f"weights and tensor plan differ: {sorted(missing)[:8]}")
    out.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(out), ARCH)
    write_metadata(w, ARCH, shape, NAME)
    w.add_description(f"trained {step} steps by scripts/demo/train_demo.py; corpus, losses and rebuild: docs/demo-model.md")
    # write_metadata adds the synthetic vocabulary; the same keys with the demo's values replace it.
    writer_log = logging.getLogger("gguf.gguf_writer")
    level = writer_log.level
    writer_log.setLevel(logging.ERROR)
    try:
        write_vocab(w, vocab)
    finally:
        writer_log.setLevel(level)
    for t in plan:
        values = np.ascontiguousarray(weights[t.name], dtype=np.float32)
        if values.shape != t.shape:
            raise SystemExit(f"{t.name}: trained shape {values.shape}, plan {t.shape}")
        qt = stored_type(t, quant)
        if qt == QT.F32:
            w.add_tensor(t.name, values)
        else:
            w.add_tensor(t.name, gguf.quants.quantize(values, qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out.stat().st_size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", type=Path, required=True, help="folder with weights-*.npz")
    ap.add_argument("--vocab", type=Path, default=Path(".demo/vocab.json"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quant", choices=["Q8_0", "F32"], default="Q8_0")
    args = ap.parse_args()
    weights, meta = load_weights(args.weights)
    size = export(weights, synth_shape(meta["shape"]), load_vocab(args.vocab, args.weights), args.out,
                  QT[args.quant], meta["step"])
    print(json.dumps({"out": str(args.out), "bytes": size, "step": meta["step"], "quant": args.quant}))


if __name__ == "__main__":
    main()
