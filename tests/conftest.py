"""Session fixtures: tiny synthesized models of both architectures, written once per test run."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def synth_model(model_dir: Path):
    """synth_model(arch, quant="F32", preset="tiny", seed=0, **overrides) -> path, cached per arguments."""
    from runner.synth import synthesize  # imported here: the GPU box has no llama_cpp for the CUDA-only tests

    made: dict[tuple, Path] = {}

    def make(arch: str, quant: str = "F32", preset: str = "tiny", seed: int = 0, **overrides: int) -> Path:
        key = (arch, quant, preset, seed, tuple(sorted(overrides.items())))
        if key not in made:
            extra = "-".join(f"{k}{v}" for k, v in sorted(overrides.items()))
            path = model_dir / f"{arch}-{preset}-{quant}-s{seed}{'-' + extra if extra else ''}.gguf"
            synthesize(path, arch, preset, quant, seed, **overrides)
            made[key] = path
        return made[key]

    return make


@pytest.fixture(scope="module")
def demo_server():
    """A live server over the demo model (context 512) for one test module; yields its base URL."""
    from runner.package_data import demo_model_path
    from test_server_harness import serve_model

    with serve_model(demo_model_path(), n_ctx=512) as (url, _):
        yield url


@pytest.fixture(scope="module")
def demo_client(demo_server):
    """The openai SDK's client of `demo_server`."""
    from test_server_harness import openai_client

    return openai_client(demo_server)


@pytest.fixture(scope="module")
def scripted_qwen3(synth_model):
    """A live server over a tiny qwen3moe whose replies are scripted (ScriptedEngine), rendered with Qwen3's
    real template, for one test module; yields (base URL, engine)."""
    from scripted_engine import ScriptedEngine
    from test_server_harness import live_server

    from runner.engine.engine import Engine, EngineConfig
    from runner.gguf_file import open_gguf
    from runner.server import ServerConfig, create_app

    template = (Path(__file__).parent / "templates" / "qwen3.jinja").read_text()
    engine = ScriptedEngine(Engine(open_gguf(synth_model("qwen3moe")), EngineConfig(n_ctx=2048), chat_template=template))
    with live_server(create_app(engine, ServerConfig(model_id="m"))) as url:
        yield url, engine
