"""A downloaded GGUF is untrusted input: mutations of a tiny model file, each run through `runner info` and
`runner generate` in a subprocess under a time and an address-space limit. Every run ends in normal
output, or in exit 1 with exactly one `error: ` line: never a traceback, a hang, or memory the limit
has to stop. The targeted cases (huge counts, wrong types and values, invalid UTF-8, unknown tensors)
also check that the message names the problem; the random ones (truncations, byte flips in each
section) are seeded, so a failure reproduces."""

from __future__ import annotations

import os
import random
import re
import resource
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader
from gguf import GGUFValueType as V
from gguf_edit import Layout, Typed, layout_of, patched, rewrite_gguf, u32, u64

SEED = 23
FLIPS_PER_SECTION = 2
TIMEOUT_S = 10  # a normal run takes about 1 s; the old reader spent 25-31 s on one huge count
MEMORY_LIMIT_BYTES = 2 << 30  # a normal generate runs in well under 1.5 GiB of address space
A = "glm4moe"
GENERATE = ("generate", "--prompt", "hi", "--max-tokens", "2", "--temperature", "0", "--backend", "numpy")

Build = Callable[[Path, Layout, Path], Path]


@dataclass(frozen=True)
class Case:
    id: str
    build: Build  # (base file, its layout, destination) -> the mutated file
    expect: str | None = None  # what a failing command's error line must contain; None: random, any outcome
    tokenizer_only: bool = False  # info does not read what is wrong: only generate (llama.cpp's vocabulary) fails


def key(name: str, value: object) -> Build:
    return lambda base, layout, dst: rewrite_gguf(base, dst, {name: value})


def raw(at: Callable[[Layout], int], new: bytes) -> Build:
    return lambda base, layout, dst: patched(base, dst, (at(layout), new))


def tensors(edit: Callable) -> Build:
    return lambda base, layout, dst: rewrite_gguf(base, dst, tensor_edit=edit)


def with_extra_key(name: str, value: Typed, then: Callable[[Layout], tuple[int, bytes]]) -> Build:
    """Add a key, then patch the rewritten file at an offset found in its own layout."""
    def build(base: Path, layout: Layout, dst: Path) -> Path:
        rewrite_gguf(base, dst, {name: value})
        return patched(dst, dst, then(layout_of(dst)))
    return build


def tokens_with(index: int, value: bytes | str | Callable[[list[str]], str]) -> Build:
    def build(base: Path, layout: Layout, dst: Path) -> Path:
        tokens = GGUFReader(base).fields["tokenizer.ggml.tokens"].contents()
        tokens[index] = value(tokens) if callable(value) else value
        return rewrite_gguf(base, dst, {"tokenizer.ggml.tokens": Typed(tokens, V.ARRAY, V.STRING)})
    return build


def key_start(layout: Layout, name: str) -> int:
    return layout.values[name] - 4 - len(name) - 8  # the key's u64 length


def name_start(layout: Layout, tensor: str) -> int:
    return layout.tensor_records[tensor]["n_dims"] - len(tensor) - 8  # the name's u64 length


def set_tensor(name: str, values: Callable[[np.ndarray], np.ndarray]) -> Callable:
    """A tensor edit giving `name` new values (same type and shape)."""
    def edit(n: str, qtype: QT, data: np.ndarray):
        return (n, qtype, values(data.copy())) if n == name else (n, qtype, data)
    return edit


def positive_to_inf(data: np.ndarray) -> np.ndarray:
    return np.where(data > 0, np.inf, data).astype(data.dtype)


def extra_tensor(new_name: str, like: str) -> Callable:
    return lambda n, qtype, data: [(n, qtype, data), (new_name, qtype, data)] if n == like else (n, qtype, data)


def renamed(old: str, new: str) -> Callable:
    return lambda n, qtype, data: (new if n == old else n, qtype, data)


TARGETED = [
    # 1. invalid UTF-8 in string metadata, keys and tensor names
    Case("utf8-name", key("general.name", Typed(b"synthetic \xff model", V.STRING)),
         r"'general.name' is not valid UTF-8"),
    Case("utf8-token", tokens_with(300, b"\xff\xfe"), r"'tokenizer.ggml.tokens' item 300 is not valid UTF-8"),
    Case("utf8-chat-template", key("tokenizer.chat_template", Typed(b"{{ messages \xc0 }}", V.STRING)),
         r"'tokenizer.chat_template' is not valid UTF-8"),
    Case("utf8-key", raw(lambda lay: key_start(lay, "general.name") + 8, b"\xff"),
         r"metadata key #\d+ is not valid UTF-8"),
    Case("utf8-tensor-name", raw(lambda lay: name_start(lay, "output_norm.weight") + 8, b"\xfe"),
         r"the name of tensor #\d+ is not valid UTF-8"),
    # 2. counts and lengths past the end of the file
    Case("huge-kv-count", raw(lambda lay: 16, u64(2**63)), r"metadata count is 9223372036854775808"),
    Case("huge-tensor-count", raw(lambda lay: 8, u64(2**40)), r"tensor count is 1099511627776"),
    Case("huge-token-count", raw(lambda lay: lay.values["tokenizer.ggml.tokens"] + 4, u64(2**62)),
         r"array length of metadata key 'tokenizer.ggml.tokens' is 4611686018427387904"),
    Case("huge-int32-array", raw(lambda lay: lay.values["tokenizer.ggml.token_type"] + 4, u64(2**61)),
         r"array length of metadata key 'tokenizer.ggml.token_type' is 2305843009213693952"),
    Case("huge-uint8-array", with_extra_key("general.fuzz_bytes", Typed([1, 2, 3], V.ARRAY, V.UINT8),
                                            lambda lay: (lay.values["general.fuzz_bytes"] + 4, u64(2**60))),
         r"array length of metadata key 'general.fuzz_bytes' is 1152921504606846976"),
    Case("nested-array", key("general.fuzz_nested", Typed([[1, 2], [3]], V.ARRAY, V.ARRAY)),
         r"'general.fuzz_nested' is an array of arrays"),
    Case("huge-string", raw(lambda lay: lay.values["general.name"], u64(2**63 - 1)), r"'general.name' needs \d+ bytes"),
    Case("huge-n-dims", raw(lambda lay: lay.tensor_records["output_norm.weight"]["n_dims"], u32(2**31)),
         r"'output_norm.weight' has 2147483648 dimensions"),
    Case("huge-dims", raw(lambda lay: lay.tensor_records["token_embd.weight"]["dims"], u64(2**40) + u64(2**40)),
         r"truncated: tensor 'token_embd.weight' needs bytes up to"),
    Case("huge-tensor-offset", raw(lambda lay: lay.tensor_records["output_norm.weight"]["offset"], u64(2**62)),
         r"truncated: tensor 'output_norm.weight'"),
    Case("unknown-tensor-type", raw(lambda lay: lay.tensor_records["output_norm.weight"]["type"], u32(1000)),
         r"'output_norm.weight' has unknown tensor type id 1000"),
    # 3. metadata of the wrong type or value
    Case("string-context-length", key(f"{A}.context_length", Typed("4096", V.STRING)),
         rf"'{A}.context_length' must be an integer, found STRING '4096'"),
    Case("float-embedding-length", key(f"{A}.embedding_length", Typed(256.0, V.FLOAT32)),
         rf"'{A}.embedding_length' must be an integer, found FLOAT32 256.0"),
    Case("array-head-count", key(f"{A}.attention.head_count", Typed([4, 4], V.ARRAY, V.UINT32)),
         rf"'{A}.attention.head_count' must be an integer, found array of UINT32"),
    Case("string-norm-epsilon", key(f"{A}.attention.layer_norm_rms_epsilon", Typed("1e-5", V.STRING)),
         r"layer_norm_rms_epsilon' must be a number, found STRING"),
    Case("int-chat-template", key("tokenizer.chat_template", Typed(5, V.UINT32)),
         r"'tokenizer.chat_template' must be a STRING"),
    Case("int-weights-norm", key(f"{A}.expert_weights_norm", Typed(1, V.UINT32)),
         r"expert_weights_norm' must be a BOOL"),
    Case("zero-head-count", key(f"{A}.attention.head_count", 0),
         rf"'{A}.attention.head_count' must be at least 1, found UINT32 0"),
    Case("zero-head-count-kv", key(f"{A}.attention.head_count_kv", 0), r"head_count_kv' must be at least 1"),
    Case("head-count-kv-not-divisor", key(f"{A}.attention.head_count_kv", 3),
         r"head_count 4 is not a multiple of head_count_kv 3"),
    Case("odd-alignment", key("general.alignment", 3),
         r"'general.alignment' must be a UINT32 power of two, found UINT32 3"),
    Case("zero-rope-base", key(f"{A}.rope.freq_base", Typed(0.0, V.FLOAT32)),
         r"rope.freq_base' must be a finite number > 0"),
    # 4. non-finite metadata, and non-finite weights (which only have to end cleanly)
    Case("nan-rope-base", key(f"{A}.rope.freq_base", Typed(float("nan"), V.FLOAT32)),
         r"rope.freq_base' must be a finite number > 0, found FLOAT32 nan"),
    Case("inf-norm-epsilon", key(f"{A}.attention.layer_norm_rms_epsilon", Typed(float("inf"), V.FLOAT64)),
         r"layer_norm_rms_epsilon' must be a finite number > 0, found FLOAT64 inf"),
    Case("nan-output-norm", tensors(set_tensor("output_norm.weight", lambda d: np.full_like(d, np.nan)))),
    Case("inf-embedding", tensors(set_tensor("token_embd.weight", positive_to_inf))),
    # 5. tensors the architecture does not have
    Case("misspelled-optional-tensor", tensors(renamed("blk.0.attn_q.bias", "blk.0.attn_q.biass")),
         r"unknown tensor 'blk.0.attn_q.biass'"),
    Case("extra-tensor", tensors(extra_tensor("blk.7.attn_norm.weight", "blk.0.attn_norm.weight")),
         r"unknown tensor 'blk.7.attn_norm.weight'"),
    # what llama.cpp's vocabulary loader would abort the process on
    Case("duplicate-token", tokens_with(301, lambda tokens: tokens[300]),
         r"'tokenizer.ggml.tokens' has token 301 equal to token 300"),
    Case("tokens-not-an-array", key("tokenizer.ggml.tokens", Typed(5, V.UINT32)),
         r"'tokenizer.ggml.tokens' must be an array of STRING, found UINT32 5"),
    # llama.cpp's own refusal: the cause it logs, not its closing "failed to load model"
    Case("unknown-tokenizer-model", key("tokenizer.ggml.model", "gpt3"), r"unknown tokenizer: 'gpt3'",
         tokenizer_only=True),
]


def random_cases(rng: random.Random) -> list[Case]:
    """In each section (header, metadata, tensor table, data): a truncation and byte flips, every offset
    and mask drawn from one seed."""
    def section(layout: Layout, name: str, where: float) -> int:
        start, end = {"header": (0, layout.kv_start), "kv": (layout.kv_start, layout.tensor_info_start),
                      "tensor-info": (layout.tensor_info_start, layout.data_start),
                      "data": (layout.data_start, layout.size)}[name]
        return start + int((end - start) * where)

    def cut(name: str, where: float) -> Build:
        def build(base: Path, layout: Layout, dst: Path) -> Path:
            dst.write_bytes(base.read_bytes()[: section(layout, name, where)])
            return dst
        return build

    def flip(name: str, where: float, mask: int) -> Build:
        def build(base: Path, layout: Layout, dst: Path) -> Path:
            data = bytearray(base.read_bytes())
            data[section(layout, name, where)] ^= mask
            dst.write_bytes(bytes(data))
            return dst
        return build

    cases = []
    for name in ("header", "kv", "tensor-info", "data"):
        where = rng.random()
        cases.append(Case(f"truncate-{name}-{where:.6f}", cut(name, where)))
        for _ in range(FLIPS_PER_SECTION):
            where, mask = rng.random(), rng.randrange(1, 256)
            cases.append(Case(f"flip-{name}-{where:.6f}-{mask:02x}", flip(name, where, mask)))
    return cases


CASES = TARGETED + random_cases(random.Random(SEED))


@dataclass(frozen=True)
class Run:
    command: str
    returncode: int | None  # None: killed by the time limit
    stdout: str
    stderr: str


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


def run_cli(args: tuple[str, ...]) -> Run:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    try:
        done = subprocess.run([sys.executable, "-m", "runner.cli", *args], check=False, capture_output=True,
                              encoding="utf-8", errors="replace", timeout=TIMEOUT_S, preexec_fn=_limit_memory,
                              env=env)
    except subprocess.TimeoutExpired as exc:
        return Run(args[0], None, str(exc.stdout or ""), str(exc.stderr or ""))
    return Run(args[0], done.returncode, done.stdout, done.stderr)


def run_case(case: Case, base: Path, layout: Layout, folder: Path) -> tuple[Run, Run]:
    path = case.build(base, layout, folder / f"{case.id}.gguf")
    try:
        return run_cli(("info", str(path))), run_cli((GENERATE[0], str(path), *GENERATE[1:]))
    finally:
        path.unlink()


@pytest.fixture(scope="module")
def outcomes(synth_model, tmp_path_factory) -> dict[str, tuple[Run, Run]]:
    base = synth_model("glm4moe", "F16", layers=2, experts=4)
    layout = layout_of(base)
    folder = tmp_path_factory.mktemp("fuzz")
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        futures = {case.id: pool.submit(run_case, case, base, layout, folder) for case in CASES}
        return {cid: future.result() for cid, future in futures.items()}


def check_run(run: Run) -> str | None:
    """Assert the run ended cleanly; returns its error line, or None when it succeeded."""
    where = f"{run.command}: exit {run.returncode}\nstdout: {run.stdout[-800:]}\nstderr: {run.stderr[-2000:]}"
    assert run.returncode is not None, f"timed out after {TIMEOUT_S} s\n{where}"
    assert "Traceback" not in run.stderr, where
    if run.returncode == 0:
        if run.command == "info":
            assert "architecture" in run.stdout, where
        else:
            assert re.fullmatch(r"\[.*finish: \w+\]", (run.stderr.strip().splitlines() or [""])[-1]), where
        return None
    assert run.returncode == 1, where  # not a signal (llama.cpp aborting), not the memory limit's kill
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), where
    assert not lines[0].startswith("error: out of memory"), where  # the address-space limit stopped it
    return lines[0]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_file_ends_in_output_or_one_error_line(case: Case, outcomes) -> None:
    info, generate = outcomes[case.id]
    errors = [check_run(info), check_run(generate)]
    if case.expect is None:
        return
    if case.tokenizer_only:
        assert errors[0] is None, errors[0]
        errors = errors[1:]
    for error in errors:
        assert error is not None and re.search(case.expect, error), f"expected /{case.expect}/ in: {error}"


def test_valid_file_passes_both_commands(synth_model) -> None:
    """The base every mutation starts from runs cleanly, so a refusal above is the mutation's doing."""
    base = synth_model("glm4moe", "F16", layers=2, experts=4)
    info = run_cli(("info", str(base)))
    generate = run_cli((GENERATE[0], str(base), *GENERATE[1:]))
    assert check_run(info) is None and check_run(generate) is None
