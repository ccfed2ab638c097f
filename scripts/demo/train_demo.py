"""Train the demo glm4moe model (trunk + NextN block) on the token streams of scripts/demo/build_corpus.py.

Loss: next-token cross-entropy of the trunk plus --mtp-weight times the NextN block's loss on the
token after next (from the trunk's final normed hidden at t and the embedding of token t+1, as
DeepSeek-V3 / GLM-4.5 train MTP). Routing balance is auxiliary-loss-free: after each step every MoE
layer's exp_probs_b moves by --bias-rate toward equal expert load (it biases selection only).

Seeded: the initial weights come from --seed, the batch of step s from (seed, s), so a resumed run
draws the batches an uninterrupted one would (Adam moments are kept as bf16, so it matches to about
1e-5, and GPU kernels are not bitwise deterministic anyway). With --steps 0 the schedule's length is
planned from the speed of the first steps and --time-limit, capped at --max-epochs; the number is
recorded (eval.json "steps_planned"), and passing it as --steps reruns the same schedule. --stop-at
splits a schedule over several calls.
Needs PyTorch and numpy only. Writes under --out: weights-*.npz (float32, GGUF tensor names, shards
under 15 MiB), optim-*.npz (Adam moments as bf16 bits, when stopped before the schedule's end or with
--save-optimizer), log.json (loss curve) and eval.json (held-out perplexity, NextN top-1 accuracy).
Weights, optimizer and log are also written every --checkpoint-s seconds, so a killed run can resume.

    python3 -m scripts.demo.train_demo --data .demo/carry --out OUT [--steps 0 --time-limit 420] [--resume DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from runner.environment import environment as runner_environment
from scripts.demo.demo_torch_model import DemoModel, DemoShape

SHARD_BYTES = 15 << 20  # files coming back from the GPU box are limited to 16 MiB each
RUNNER_WINDOWS = 8  # held-out windows the runner re-scores (scripts/demo/eval_demo.py): per-window losses kept
PLAN_AFTER = 40  # steps timed before planning the schedule (inside the warm-up, which no plan changes)
PLAN_SKIP = 10  # first steps left out of the timing (allocator and kernel selection warm-up)


def load_stream(data: Path, name: str) -> np.ndarray:
    plain, packed = data / f"{name}.npy", data / f"{name}.npz"
    if plain.exists():
        return np.load(plain)
    with np.load(packed) as z:
        return z["tokens"]


def save_shards(out: Path, prefix: str, arrays: dict[str, np.ndarray]) -> list[str]:
    """Arrays in files of at most SHARD_BYTES each, written under temporary names and then renamed."""
    for old in out.glob(f"{prefix}-*.npz"):
        old.unlink()
    names, shard, size = [], {}, 0
    for key, value in arrays.items():
        if shard and size + value.nbytes > SHARD_BYTES:
            names.append(_write(out, prefix, len(names), shard))
            shard, size = {}, 0
        shard[key] = value
        size += value.nbytes
    if shard:
        names.append(_write(out, prefix, len(names), shard))
    return names


def _write(out: Path, prefix: str, index: int, shard: dict[str, np.ndarray]) -> str:
    name = f"{prefix}-{index}.npz"
    with open(out / f"{name}.tmp", "wb") as f:
        np.savez(f, **shard)
    (out / f"{name}.tmp").rename(out / name)
    return name


def load_shards(folder: Path, prefix: str) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    for path in sorted(folder.glob(f"{prefix}-*.npz")):
        with np.load(path) as z:
            arrays.update({k: z[k] for k in z.files})
    return arrays


def bf16_bits(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.bfloat16).view(torch.int16).cpu().numpy()


def from_bf16_bits(a: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(a).to(device).view(torch.bfloat16).float()


def batch(stream: torch.Tensor, seed: int, step: int, n: int, seq: int) -> torch.Tensor:
    starts = np.random.default_rng([seed, step]).integers(0, stream.numel() - seq - 1, size=n)
    index = torch.from_numpy(starts).to(stream.device)[:, None] + torch.arange(seq + 1, device=stream.device)
    return stream[index].long()  # [n, seq + 1]


def losses(model: DemoModel, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor], torch.Tensor]:
    """x [B, T+1] -> main loss [B, T], MTP loss [B, T-1], expert ids per MoE layer, NextN top-1 hits [B, T-1]."""
    inp = x[:, :-1]
    logits, hidden, routes = model.trunk(inp)
    main = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten(), reduction="none").view(x.shape[0], -1)
    mtp_logits, mtp_ids = model.mtp(hidden[:, :-1], inp[:, 1:])  # hidden at t, token t+1 -> token t+2
    mtp = F.cross_entropy(mtp_logits.float().flatten(0, 1), x[:, 2:].flatten(), reduction="none").view(x.shape[0], -1)
    mtp_hit = (mtp_logits.argmax(-1) == x[:, 2:]).float()
    return main, mtp, [*routes, mtp_ids], mtp_hit


def lr_at(step: int, peak: float, warmup: int, total: int) -> float:
    """Linear warm-up, then cosine down to a tenth of the peak at `total`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def evaluate(model: DemoModel, test: torch.Tensor, seq: int, max_windows: int | None, autocast: bool) -> dict:
    """Non-overlapping windows of `seq` tokens from the start of `test`, each scored from position 0
    (predictions for tokens 1..seq-1), as the runner's Engine.logits_all scores a window."""
    n = test.numel() // seq if max_windows is None else min(max_windows, test.numel() // seq)
    windows = test[: n * seq].view(n, seq).long()
    main_sum = mtp_sum = hit_sum = 0.0
    per_window: list[float] = []
    count = mtp_count = 0
    for start in range(0, n, 16):
        x = windows[start : start + 16]
        with torch.autocast(test.device.type, dtype=torch.bfloat16, enabled=autocast):
            main, mtp, _, hit = losses(model, x)
        per_window += main.mean(1).tolist()
        main_sum += main.sum().item()
        mtp_sum += mtp.sum().item()
        hit_sum += hit.sum().item()
        count += main.numel()
        mtp_count += mtp.numel()
    return {"windows": n, "window_tokens": seq, "predictions": count, "loss": main_sum / count,
            "ppl": math.exp(main_sum / count), "mtp_loss": mtp_sum / mtp_count,
            "mtp_top1": hit_sum / mtp_count, "window_loss": per_window[:RUNNER_WINDOWS]}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="folder with {train,test}.npy or .npz")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--resume", type=Path, help="a folder this script wrote (weights, optimizer, log)")
    ap.add_argument("--steps", type=int, default=0, help="total steps of the schedule; 0: plan from --time-limit")
    ap.add_argument("--time-limit", type=float, default=420.0, help="seconds for this call, final evaluation included")
    ap.add_argument("--stop-at", type=int, help="end this call after this step (resume later with --resume)")
    ap.add_argument("--max-epochs", type=float, default=20.0, help="a planned schedule stops here (--steps 0)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--mtp-weight", type=float, default=0.3)
    ap.add_argument("--bias-rate", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--checkpoint-s", type=float, default=150.0, help="seconds between weight checkpoints")
    ap.add_argument("--save-optimizer", action="store_true")
    ap.add_argument("--final-reserve", type=float, default=45.0,
                    help="seconds of --time-limit kept for the final fp32 evaluation and the files")
    ap.add_argument("--final-windows", type=int, default=0, help="held-out windows of the final evaluation; 0: all")
    args = ap.parse_args()
    if args.warmup < PLAN_AFTER and args.steps == 0:
        ap.error(f"--steps 0 plans after {PLAN_AFTER} steps, inside the warm-up: --warmup must be >= {PLAN_AFTER}")
    return args


def environment(device: torch.device) -> dict:
    """The shared measurement environment, plus torch and the device it trains on."""
    env = {**runner_environment(), "torch": torch.__version__, "device": str(device)}
    if device.type == "cuda":
        env.update(gpu=torch.cuda.get_device_name(device), cuda=torch.version.cuda)
    return env


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: local checks only
    on_gpu = device.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True

    shape = DemoShape(n_ctx=args.seq)
    torch.manual_seed(args.seed)
    model = DemoModel(shape).to(device)
    named = model.gguf_parameters()
    params = [t for t in named.values() if t.requires_grad]
    decay = [t for k, t in named.items() if t.requires_grad and t.dim() >= 2 and k != "token_embd.weight"]
    rest = [t for t in params if all(t is not d for d in decay)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if on_gpu else {}))
    step, log, total = 0, [], args.steps
    if args.resume:
        step, log, planned = resume(args.resume, model, opt, device)
        total = total or planned
    print(f"params {sum(t.numel() for t in params) / 1e6:.2f}M, starting at step {step}, {environment(device)}", flush=True)

    train = torch.from_numpy(load_stream(args.data, "train").astype(np.int32)).to(device)
    test = torch.from_numpy(load_stream(args.data, "test").astype(np.int32)).to(device)
    moe_blocks = [b for b in [*model.blocks, model.nextn] if b.moe]
    tokens_per_step = args.batch * args.seq
    begin, first_step, last_checkpoint = time.time(), step, time.time()
    timer: dict[str, float] = {}
    train_s = args.time_limit - args.final_reserve
    stop_at = args.stop_at or sys.maxsize
    while (total == 0 or step < total) and step < stop_at and time.time() - begin < train_s:
        if total == 0:
            epochs_cap = int(args.max_epochs * train.numel() / tokens_per_step)
            total = plan(step - first_step, timer, begin, train_s, step, on_gpu, epochs_cap)
        lr = lr_at(step, args.lr, args.warmup, max(total, args.warmup + 1))
        for group in opt.param_groups:
            group["lr"] = lr
        x = batch(train, args.seed, step, args.batch, args.seq)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on_gpu):
            main, mtp, routes, _ = losses(model, x)
            loss = main.mean() + args.mtp_weight * mtp.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        with torch.no_grad():  # auxiliary-loss-free balancing (DeepSeek-V3): push load toward the mean
            loads = []
            for block, ids in zip(moe_blocks, routes):
                counts = torch.bincount(ids.flatten(), minlength=shape.n_expert).float()
                block.exp_probs_b += args.bias_rate * torch.sign(counts.mean() - counts)
                loads.append(counts.max() / counts.mean())
        step += 1
        if step % args.log_every == 0 or step == 1:
            row = {"step": step, "elapsed_s": round(time.time() - begin, 2), "tokens": step * tokens_per_step,
                   "epochs": round(step * tokens_per_step / train.numel(), 3), "lr": lr, "loss": main.mean().item(),
                   "mtp_loss": mtp.mean().item(), "grad_norm": grad_norm.item(),
                   "max_load_over_mean": max(v.item() for v in loads)}
            if step % args.eval_every == 0:
                model.eval()
                row["test"] = {k: v for k, v in evaluate(model, test, args.seq, 32, on_gpu).items() if k != "window_loss"}
                model.train()
            log.append(row)
            print(json.dumps(row), flush=True)
        if time.time() - last_checkpoint > args.checkpoint_s:  # resumable: the optimizer too
            save_weights(args.out, named, step, total, shape, log)
            save_shards(args.out, "optim", optimizer_arrays(named, opt))
            last_checkpoint = time.time()

    elapsed = time.time() - begin
    model.eval()
    torch.backends.cuda.matmul.allow_tf32 = False  # the final figures in true float32, as the runner computes
    torch.backends.cudnn.allow_tf32 = False
    result = {"steps": step, "steps_planned": total, "train_s_this_call": round(elapsed, 1),
              "tokens_per_s_this_call": round(tokens_per_step * (step - first_step) / max(elapsed, 1e-9)),
              "epochs": round(step * tokens_per_step / train.numel(), 3), "environment": environment(device),
              "data": _data_stats(args.data), "shape": shape.as_dict(), "args": {k: str(v) for k, v in vars(args).items()},
              "test_fp32": evaluate(model, test, args.seq, args.final_windows or None, False),
              "train_fp32_sample": {k: v for k, v in evaluate(model, train[: 64 * args.seq], args.seq, None, False).items()
                                    if k != "window_loss"}}
    (args.out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    files = save_weights(args.out, named, step, total, shape, log)
    finished = total > 0 and step >= total
    if not finished or args.save_optimizer:
        files += save_shards(args.out, "optim", optimizer_arrays(named, opt))
    else:  # the schedule is done: no need to carry 2 more files back
        for old in args.out.glob("optim-*.npz"):
            old.unlink()
    print(json.dumps({"files": files, "steps": step, "steps_planned": total, "eval_s": round(time.time() - begin - elapsed, 1),
                      "test_fp32": {k: v for k, v in result["test_fp32"].items() if k != "window_loss"}}), flush=True)


def plan(done: int, timer: dict[str, float], begin: float, train_s: float, step: int, on_gpu: bool, cap: int) -> int:
    """0 while timing the first steps; then the total steps that fit in `train_s` (periodic evals included),
    at most `cap`: past a few tens of epochs a model this size learns the training packages by heart."""
    if done == PLAN_SKIP or done == PLAN_AFTER:
        if on_gpu:
            torch.cuda.synchronize()
        timer[str(done)] = time.time()
    if done < PLAN_AFTER:
        return 0
    step_s = (timer[str(PLAN_AFTER)] - timer[str(PLAN_SKIP)]) / (PLAN_AFTER - PLAN_SKIP)
    left_s = train_s - (time.time() - begin)
    fits = step + int(0.92 * left_s / step_s)  # 8% for the periodic held-out evaluations and checkpoints
    total = min(fits, cap)
    print(json.dumps({"planned_steps": total, "steps_that_fit": fits, "step_s": round(step_s, 4)}), flush=True)
    return total


def _data_stats(data: Path) -> dict | None:
    path = data / "stats.json"
    return json.loads(path.read_text()) if path.exists() else None


def save_weights(out: Path, named: dict[str, torch.Tensor], step: int, total: int, shape: DemoShape,
                 log: list) -> list[str]:
    weights = {k: v.detach().float().cpu().numpy() for k, v in named.items()}
    meta = {"step": step, "steps_planned": total, "shape": shape.as_dict()}
    weights["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    (out / "log.json").write_text(json.dumps(log) + "\n")
    return save_shards(out, "weights", weights)


def optimizer_arrays(named: dict[str, torch.Tensor], opt: torch.optim.Optimizer) -> dict[str, np.ndarray]:
    moments: dict[str, np.ndarray] = {}
    for key, t in named.items():
        state = opt.state.get(t)
        if state:
            moments[f"m:{key}"] = bf16_bits(state["exp_avg"])
            moments[f"v:{key}"] = bf16_bits(state["exp_avg_sq"])
            moments[f"s:{key}"] = np.asarray([float(state["step"])], dtype=np.float32)
    return moments


def resume(folder: Path, model: DemoModel, opt: torch.optim.Optimizer, device: torch.device) -> tuple[int, list, int]:
    """Weights, Adam moments and log from `folder`: (step, log, planned total steps)."""
    weights = load_shards(folder, "weights")
    meta = json.loads(weights.pop("__meta__").tobytes())
    with torch.no_grad():
        for key, t in model.gguf_parameters().items():
            t.copy_(torch.from_numpy(weights[key]).to(device))
    moments = load_shards(folder, "optim")
    if not moments:
        raise SystemExit(f"{folder} has no optim-*.npz: the run finished its schedule (or was killed before saving it)")
    for key, t in model.gguf_parameters().items():
        if f"m:{key}" in moments:
            opt.state[t] = {"exp_avg": from_bf16_bits(moments[f"m:{key}"], device),
                            "exp_avg_sq": from_bf16_bits(moments[f"v:{key}"], device),
                            "step": torch.tensor(float(moments[f"s:{key}"][0]), device=device)}
    log_path = folder / "log.json"
    log = json.loads(log_path.read_text()) if log_path.exists() else []
    return int(meta["step"]), log, int(meta.get("steps_planned", 0))


if __name__ == "__main__":
    main()
