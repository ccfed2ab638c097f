"""The real `runner chat` in a pseudo-terminal: streaming, prefix reuse, Ctrl-C, commands, context limits."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import pexpect

from runner.engine.engine import Engine
from runner.engine.tokenizer import Tokenizer

PROMPT = ">>> "
SUMMARY = re.compile(r"\[(\d+) prompt tokens: (\d+) new, (\d+) cached, [\d.]+ tok/s prefill \| "
                     r"(\d+) generated, [\d.]+ tok/s decode \| finish: (\w+)\]")


def _default_sigint() -> None:
    """Ctrl-C reaches the child even when the test run was started in the background (a shell's
    background jobs ignore SIGINT, and a child inherits that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def spawn(model: Path, *args: str, term: str = "dumb") -> pexpect.spawn:
    # chat_command directly, so the test does not depend on its registration in runner.cli.
    child = pexpect.spawn(sys.executable, ["-c", "from runner.cli.chat import chat_command; chat_command()",
                                           str(model), *args],
                          env={**os.environ, "TERM": term}, encoding="utf-8", codec_errors="replace",
                          timeout=30, dimensions=(50, 400), preexec_fn=_default_sigint)
    child.expect_exact(PROMPT)
    return child


def say(child: pexpect.spawn, line: str) -> str:
    """Send a line; everything printed before the next prompt, without the echoed line."""
    child.sendline(line)
    child.expect_exact(line + "\r\n")
    child.expect_exact(PROMPT)
    return child.before


def turn(child: pexpect.spawn, line: str) -> tuple[str, dict[str, int | str]]:
    out = say(child, line)
    m = SUMMARY.search(out)
    assert m, out
    figures = dict(zip(("prompt", "new", "cached", "generated"), map(int, m.groups()[:4])), finish=m.group(5))
    return out[: m.start()], figures


def quit_with_ctrl_d(child: pexpect.spawn) -> None:
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def _alnum(text: str) -> str:
    return re.sub(r"[^0-9A-Za-z]", "", text)


def test_turns_stream_and_reuse_the_previous_turns_tokens(synth_model, tmp_path: Path) -> None:
    model = synth_model("glm4moe")
    child = spawn(model, "--system", "Be brief.", "--temperature", "0", "--max-tokens", "50")
    assert "loading glm4moe" in child.before and "/help" in child.before
    reply1, first = turn(child, "Hello")
    reply2, second = turn(child, "And why?")

    tok = Tokenizer(model)
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    assert first["prompt"] == len(tok.encode(tok.render_chat(history), add_special=True)) and first["cached"] == 0
    # The new turn's own tokens: what the template adds after a reply (any reply) for the next user line.
    with_reply = history + [{"role": "assistant", "content": "x"}]
    before = tok.render_chat(with_reply, add_generation_prompt=False)
    after = tok.render_chat(with_reply + [{"role": "user", "content": "And why?"}])
    new_turn = len(tok.encode(after[len(before):], add_special=False))
    unfed = 1 if first["finish"] == "length" else 0  # a reply cut by max_tokens never fed its last token
    assert second["new"] == new_turn + unfed
    assert second["cached"] == first["prompt"] + first["generated"] - unfed > 0

    stats = say(child, "/stats")
    assert "turns: 2 (0 interrupted), 4 messages" in stats
    assert f"prompt tokens: {first['prompt'] + second['prompt']} ({first['new'] + second['new']} new" in stats

    saved = tmp_path / "chat.json"
    assert "saved 4 messages" in say(child, f"/save {saved}")
    data = json.loads(saved.read_text())
    assert data["system"] == "Be brief." and data["settings"]["temperature"] == 0
    assert data["settings"]["max_tokens"] == 50 and data["settings"]["n_ctx"] == 4096
    assert [(m["role"], m["content"]) for m in data["messages"][::2]] == [("user", "Hello"), ("user", "And why?")]
    assert _alnum(reply1) == _alnum(data["messages"][1]["content"]) and _alnum(reply1)
    assert _alnum(reply2) == _alnum(data["messages"][3]["content"])
    assert len(data["messages"][1]["tokens"]) == first["generated"]
    quit_with_ctrl_d(child)


def test_ctrl_c_stops_the_reply_and_keeps_the_session(synth_model) -> None:
    # Greedy on this model and prompt runs to max_tokens (seconds), so Ctrl-C lands mid-reply.
    child = spawn(synth_model("qwen3moe"), "--temperature", "0", "--max-tokens", "1500", "--n-ctx", "4096")
    child.sendline("Write an essay")
    child.expect_exact("Write an essay\r\n")
    child.read_nonblocking(1, timeout=20)  # the reply has started streaming
    child.sendintr()
    child.expect(SUMMARY)
    interrupted = child.match
    assert interrupted.group(5) == "interrupted" and 0 < int(interrupted.group(4)) < 1500
    child.expect_exact(PROMPT)
    _, nxt = turn(child, "Thanks")
    assert nxt["finish"] in ("stop", "length")
    # a greedy chain's step ahead (Engine.GREEDY_AHEAD) had fed the reply's last token too
    assert nxt["cached"] == int(interrupted.group(1)) + int(interrupted.group(4)) - (0 if Engine.GREEDY_AHEAD else 1)
    assert "turns: 2 (1 interrupted)" in say(child, "/stats")
    quit_with_ctrl_d(child)


def test_commands_reset_system_load_unknown_and_ctrl_c_at_the_prompt(synth_model, tmp_path: Path) -> None:
    model = synth_model("glm4moe")
    child = spawn(model, "--temperature", "0", "--max-tokens", "8")
    _, first = turn(child, "Hello")
    saved = tmp_path / "one.json"
    say(child, f"/save {saved}")

    assert "conversation cleared" in say(child, "/reset")
    assert "0 messages in the conversation" in say(child, "/stats")
    assert "no system prompt" in say(child, "/system")
    assert "system prompt set" in say(child, "/system Answer in French.")
    assert "system prompt: 'Answer in French.'" in say(child, "/system")
    _, fresh = turn(child, "Hi")
    tok = Tokenizer(model)
    rendered = tok.render_chat([{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hi"}])
    assert fresh["prompt"] == len(tok.encode(rendered, add_special=True))

    loaded = say(child, f"/load {saved}")
    assert "loaded 2 messages" in loaded and "temperature 0.0" in loaded
    assert "no system prompt" in say(child, "/system")
    assert "unknown command /frobnicate; /help lists the commands" in say(child, "/frobnicate now")
    assert "usage: /save FILE" in say(child, "/save")
    assert "error: cannot read" in say(child, f"/load {tmp_path / 'missing.json'}")

    child.send("half a line")
    # Wait until readline has taken the keys: a SIGINT that lands while it is still handling a key is
    # only noticed at the next Enter (CPython's readline loop), a race no typist meets.
    child.expect_exact("half a line")
    time.sleep(0.1)
    child.sendintr()  # clears the line: the next command arrives alone
    child.expect_exact(PROMPT)
    help_text = say(child, "/help")
    assert "/reset" in help_text and "/load FILE" in help_text and "unknown" not in help_text
    quit_with_ctrl_d(child)


def test_too_long_conversation_is_one_line_and_reset_recovers(synth_model) -> None:
    child = spawn(synth_model("glm4moe"), "--temperature", "0", "--max-tokens", "50", "--n-ctx", "40")
    out = say(child, "Hello")
    cut = SUMMARY.search(out)
    assert int(cut.group(1)) + int(cut.group(4)) == 40 and cut.group(5) == "length"
    assert "the context is full: /reset to start over" in out[cut.end():]
    full = say(child, "Tell me more")
    lines = [line for line in full.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: context full") and "/reset" in lines[0], full
    assert "Traceback" not in full
    say(child, "/reset")
    _, again = turn(child, "Hi")
    assert again["generated"] > 0
    quit_with_ctrl_d(child)


def test_summary_is_dim_on_a_colour_terminal_and_exit_quits(synth_model) -> None:
    child = spawn(synth_model("glm4moe"), "--max-tokens", "4", "--seed", "1", term="xterm")
    child.sendline("Hello")
    child.expect(r"\x1b\[2m\[\d+ prompt tokens")
    child.expect_exact(PROMPT)
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def _one_error_line(out: str, starts: str) -> None:
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: " + starts), out


def test_hostile_input_is_one_error_line_and_the_conversation_stays(synth_model, tmp_path: Path) -> None:
    """Bytes that are not UTF-8, and /load of a deeply nested file, of wrongly typed settings and of /dev/zero."""
    child = spawn(synth_model("glm4moe"), "--temperature", "0", "--max-tokens", "8")
    _, first = turn(child, "Hello")

    os.write(child.child_fd, b"\xffhi\r")  # what a terminal set to Latin-1 sends for "ÿhi"
    child.expect_exact("hi\r\n")  # the echo of the line
    child.expect_exact(PROMPT)
    _one_error_line(child.before, "the line is not valid UTF-8 (byte 0xff at character 0) and was not sent")

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    _one_error_line(say(child, f"/load {deep}"), f"{deep} is not a chat file: nested deeper")
    typed = tmp_path / "typed.json"
    typed.write_text(json.dumps({"messages": [], "settings": {"seed": "7", "max_tokens": 1.5}}))
    _one_error_line(say(child, f"/load {typed}"), f"{typed}: bad settings: max_tokens must be an integer")
    _one_error_line(say(child, "/load /dev/zero"), "cannot read the chat file /dev/zero: not a regular file")

    assert "turns: 1 (0 interrupted), 2 messages in the conversation" in say(child, "/stats")
    _, second = turn(child, "Again")
    assert second["cached"] > first["prompt"]  # the kept conversation is still the KV prefix
    quit_with_ctrl_d(child)


def test_piped_lines_that_are_not_utf8_are_refused_and_the_session_goes_on(synth_model) -> None:
    import subprocess

    done = subprocess.run([sys.executable, "-m", "runner.cli", "chat", str(synth_model("glm4moe")), "--max-tokens",
                           "4", "--temperature", "0"], input=b"\xff\xfe binary\n/system \xc3\n/stats\n",
                          capture_output=True, timeout=120)
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert err.count("error: the line is not valid UTF-8") == 2 and "Traceback" not in err
    assert "turns: 0 (0 interrupted), 0 messages" in err and "system prompt set" not in err
