"""`runner serve` as a process: it announces its address, serves, stops on Ctrl-C; bad input is one line."""

from __future__ import annotations

import queue
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx

SERVE = "from runner.cli.serve import serve_command; serve_command(prog_name='runner serve')"


def serve(*args: str) -> subprocess.Popen:
    # SIGINT at its default even when this run was started in the background (whose jobs ignore it).
    return subprocess.Popen([sys.executable, "-c", SERVE, *args], stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def stderr_lines(proc: subprocess.Popen) -> "queue.Queue[str]":
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    return lines


def test_serve_announces_serves_and_stops_on_ctrl_c(synth_model) -> None:
    path = synth_model("qwen3moe")
    proc = serve(str(path), "--port", "0", "--n-ctx", "128", "--queue", "1")
    try:
        lines = stderr_lines(proc)
        line = ""
        while "serving" not in line:
            line = lines.get(timeout=60)
        url = line.split(" on ", 1)[1].split()[0]  # "serving STEM on http://127.0.0.1:PORT/v1 (context 128)"
        assert url.startswith("http://127.0.0.1:") and "(context 128)" in line
        assert httpx.get(url.removesuffix("/v1") + "/health").json() == {"status": "ok"}
        models = httpx.get(f"{url}/models").json()
        assert models["data"][0]["id"] == path.stem
    finally:
        proc.send_signal(signal.SIGINT)
        # uvicorn shuts down gracefully, then re-raises the signal: the CLI's usual Ctrl-C exit.
        assert proc.wait(30) == 130


def test_bad_model_and_busy_port_are_one_line_errors(tmp_path: Path, synth_model) -> None:
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"hello")
    proc = serve(str(bad), "--port", "0")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and err.startswith("error: ") and err.strip().count("\n") == 0
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        proc = serve(str(synth_model("qwen3moe")), "--port", str(taken.getsockname()[1]))
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and err.startswith("error: cannot listen on 127.0.0.1:") and err.strip().count("\n") == 0
