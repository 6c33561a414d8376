"""Training half of scripts/train_default_model.py: model config, the training loop
(`train`), concurrent variants (`sweep`) and their command-line flags."""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time

from shakespeare_data import DEFAULT_DATA, MODEL_FILES, log

def build_config(args, vocab_size, eot_id):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads,
        max_position_embeddings=args.max_positions,
        rope_theta=args.rope_theta,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        initializer_range=0.02,
        bos_token_id=eot_id,
        eos_token_id=eot_id,
        pad_token_id=eot_id,
        attention_dropout=0.0,
    )


def save_model(model, out, dtype_name, eot_id):
    import torch
    from transformers import GenerationConfig

    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[dtype_name]
    os.makedirs(out, exist_ok=True)
    model.config.attention_dropout = 0.0
    m = model.to(dtype)
    m.config.dtype = dtype
    m.save_pretrained(out, safe_serialization=True)
    # transformers 5 writes rope_parameters only; keep the flat key that 4.x and simple loaders read
    cpath = os.path.join(out, "config.json")
    with open(cpath) as f:
        cfg = json.load(f)
    cfg.setdefault("rope_theta", cfg.get("rope_parameters", {}).get("rope_theta", 10000.0))
    with open(cpath, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    GenerationConfig(bos_token_id=eot_id, eos_token_id=eot_id, pad_token_id=eot_id,
                     do_sample=False, max_new_tokens=256).save_pretrained(out)


def add_residual_dropout(model, p):
    """Dropout on each attention / MLP branch output before the residual add (training only).

    Done with forward hooks so the saved model stays a plain LlamaForCausalLM.
    """
    import torch.nn.functional as F

    def hook(mod, inp, out):
        return F.dropout(out, p, mod.training)

    handles = []
    if p > 0:
        for layer in model.model.layers:
            handles.append(layer.self_attn.o_proj.register_forward_hook(hook))
            handles.append(layer.mlp.down_proj.register_forward_hook(hook))
    return handles


# ==========================================================================
# train


def cmd_train(args):
    import numpy as np
    import torch
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM

    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    dev = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    with open(os.path.join(args.data, "tokenizer_stats.json")) as f:
        tstats = json.load(f)
    vocab, eot = tstats["vocab_size"], tstats["eot_id"]
    train = torch.from_numpy(np.load(os.path.join(args.data, "train.npy")).astype(np.int64)).to(dev)
    val = torch.from_numpy(np.load(os.path.join(args.data, "val.npy")).astype(np.int64)).to(dev)
    if args.limit_tokens:
        train, val = train[: args.limit_tokens], val[: max(args.seq_len + 1, args.limit_tokens // 10)]

    cfg = build_config(args, vocab, eot)
    cfg.attention_dropout = args.dropout
    model = LlamaForCausalLM(cfg).to(dev)
    model.config._attn_implementation = "sdpa"
    add_residual_dropout(model, args.dropout)
    n_params = sum(p.numel() for p in model.parameters())
    L, B = args.seq_len, args.batch_size
    tokens_per_step = L * B
    steps_per_epoch = max(1, (train.numel() - 1) // tokens_per_step)
    max_steps = args.max_steps or int(args.epochs * steps_per_epoch)
    log(f"[{args.name}] device={dev} params={n_params:,} train_tokens={train.numel():,} val_tokens={val.numel():,} "
        f"tokens/step={tokens_per_step} steps/epoch={steps_per_epoch} max_steps={max_steps} "
        f"time_budget={args.time_budget}s dropout={args.dropout} lr={args.lr} wd={args.weight_decay}")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(args.beta1, args.beta2), eps=1e-8, fused=(dev.type == "cuda"),
    )
    amp = dev.type == "cuda" and args.amp == "bf16"

    def lr_at(progress, step):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        p = min(1.0, progress)
        lo = args.lr * args.min_lr_ratio
        return lo + 0.5 * (args.lr - lo) * (1 + math.cos(math.pi * p))

    # fixed eval sets: all of val in non-overlapping windows; a fixed sample of train windows
    def windows(data, n=None, gen=None):
        nwin = (data.numel() - 1) // L
        if n is None:
            starts = torch.arange(nwin, device=dev) * L
        else:
            starts = torch.randint(0, data.numel() - L - 1, (n,), generator=gen, device="cpu").to(dev)
        idx = starts[:, None] + torch.arange(L + 1, device=dev)[None]
        return data[idx]

    val_w = windows(val)
    g = torch.Generator().manual_seed(1234)
    train_w = windows(train, n=max(8, min(len(val_w), 64)), gen=g)

    @torch.no_grad()
    def evaluate(w, use_amp=None):
        use_amp = amp if use_amp is None else use_amp
        model.eval()
        tot, cnt = 0.0, 0
        for i in range(0, len(w), args.eval_batch):
            chunk = w[i:i + args.eval_batch]
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_amp):
                logits = model(input_ids=chunk[:, :-1]).logits
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), chunk[:, 1:].reshape(-1),
                                   reduction="sum")
            tot += loss.item()
            cnt += chunk[:, 1:].numel()
        model.train()
        return tot / cnt

    curve = []
    best = {"val_loss": float("inf"), "step": -1}
    best_state = None
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    model.train()
    t0 = time.time()
    step = 0
    run_loss, run_n = 0.0, 0
    ar = torch.arange(L + 1, device=dev)[None]
    while True:
        elapsed = time.time() - t0
        progress = max(step / max_steps, elapsed / args.time_budget if args.time_budget else 0.0)
        last = progress >= 1.0
        if step % args.eval_every == 0 or last:
            vl = evaluate(val_w)
            tl = evaluate(train_w)
            rec = {"step": step, "epoch": round(step / steps_per_epoch, 2), "time_s": round(time.time() - t0, 1),
                   "lr": lr_at(progress, step), "train_loss": round(tl, 4), "val_loss": round(vl, 4),
                   "train_loss_running": round(run_loss / max(run_n, 1), 4)}
            curve.append(rec)
            tag = ""
            if vl < best["val_loss"]:
                best = {"val_loss": round(vl, 4), "train_loss": round(tl, 4), "step": step, "epoch": rec["epoch"],
                        "time_s": rec["time_s"]}
                best_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
                tag = " *best"
            log(f"[{args.name}] step {step:6d} ep {rec['epoch']:6.2f} t {rec['time_s']:6.1f}s lr {rec['lr']:.2e} "
                f"train(run) {rec['train_loss_running']:.4f} train {tl:.4f} val {vl:.4f}{tag}")
            run_loss, run_n = 0.0, 0
        if last:
            break
        for gidx in opt.param_groups:
            gidx["lr"] = lr_at(progress, step)
        starts = torch.randint(0, train.numel() - L - 1, (B,), generator=gen).to(dev)
        batch = train[starts[:, None] + ar]
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(input_ids=batch[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        run_loss += loss.item() if (step % 10 == 0) else 0.0
        run_n += 1 if (step % 10 == 0) else 0
        step += 1

    wall = time.time() - t0
    model.load_state_dict(best_state)
    model.to("cpu")
    save_model(model, args.out, args.save_dtype, eot)
    # re-check the saved (rounded) weights on val
    from transformers import AutoModelForCausalLM
    saved = AutoModelForCausalLM.from_pretrained(args.out, dtype=torch.float32).to(dev)
    model = saved
    saved_val = evaluate(val_w, use_amp=False)  # fp32, as the engine runs on CPU
    summary = {
        "name": args.name, "params": n_params, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "wall_s": round(wall, 1), "steps": step, "tokens_seen": step * tokens_per_step,
        "epochs": round(step / steps_per_epoch, 2), "best": best,
        "val_loss_saved_weights_fp32": round(saved_val, 4), "save_dtype": args.save_dtype,
        "hparams": {k: v for k, v in vars(args).items() if k != "func"},
        "train_tokens": int(train.numel()), "val_tokens": int(val.numel()), "curve": curve,
    }
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    log(f"[{args.name}] done: {step} steps in {wall:.1f}s, best val {best['val_loss']} at step {best['step']} "
        f"(epoch {best['epoch']}), saved {args.save_dtype} weights val {saved_val:.4f}")


# ==========================================================================
# sweep


SWEEP_DEFAULT = [
    # name, extra train args
    "A:--dropout 0.1 --epochs 15",
    "B:--dropout 0.2 --epochs 30",
    "C:--dropout 0.3 --epochs 50",
]


def cmd_sweep(args, passthrough):
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    variants = args.variant or SWEEP_DEFAULT
    procs = []
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for v in variants:
        name, extra = v.split(":", 1)
        rd = os.path.join(args.work, name)
        cli = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_default_model.py")
        cmd = [sys.executable, cli, "train", "--name", name, "--out", rd,
               "--data", args.data] + passthrough + extra.split()
        logf = open(os.path.join(args.out, f"{name}.log"), "w")
        log("launch:", " ".join(cmd))
        procs.append((name, rd, subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env), logf))
    results = []
    for name, rd, p, logf in procs:
        rc = p.wait()
        logf.close()
        sp = os.path.join(rd, "summary.json")
        if rc == 0 and os.path.exists(sp):
            with open(sp) as f:
                results.append(json.load(f))
        else:
            log(f"variant {name} failed rc={rc}; tail of its log:")
            with open(os.path.join(args.out, f"{name}.log")) as f:
                log(f.read()[-3000:])
    if not results:
        raise SystemExit("all variants failed")
    results.sort(key=lambda r: r["val_loss_saved_weights_fp32"])
    win = results[0]
    for fn in MODEL_FILES:
        shutil.copy(os.path.join(args.work, win["name"], fn), os.path.join(args.out, fn))
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({"winner": win["name"], "runs": results}, f, indent=1)
    log("\n=== sweep results (best first) ===")
    for r in results:
        b = r["best"]
        log(f"{r['name']}: best val {b['val_loss']} (train {b['train_loss']}) at step {b['step']} epoch {b['epoch']} "
            f"t={b['time_s']}s | saved {r['save_dtype']} val {r['val_loss_saved_weights_fp32']} | "
            f"{r['steps']} steps {r['epochs']} epochs {r['wall_s']}s | {r['hparams']['dropout']=}")
    log(f"winner: {win['name']} -> {args.out}")
    for r in results:
        log(f"--- curve {r['name']} (step epoch time train val) ---")
        for c in r["curve"]:
            log(f"{c['step']:6d} {c['epoch']:6.2f} {c['time_s']:6.1f} {c['train_loss']:.4f} {c['val_loss']:.4f}")


# ==========================================================================
# export


def add_model_args(p):
    g = p.add_argument_group("model shape")
    g.add_argument("--hidden", type=int, default=256, help="hidden size (default 256)")
    g.add_argument("--layers", type=int, default=6, help="decoder layers (default 6)")
    g.add_argument("--heads", type=int, default=8, help="attention heads (default 8)")
    g.add_argument("--kv-heads", type=int, default=4, help="key/value heads, GQA (default 4)")
    g.add_argument("--intermediate", type=int, default=768, help="MLP intermediate size (default 768)")
    g.add_argument("--max-positions", type=int, default=1024, help="max_position_embeddings (default 1024)")
    g.add_argument("--rope-theta", type=float, default=10000.0, help="RoPE base (default 10000)")


def add_train_args(p):
    add_model_args(p)
    g = p.add_argument_group("training")
    g.add_argument("--data", default=DEFAULT_DATA, help="prepared data folder (default .dev/shakespeare)")
    g.add_argument("--device", default="auto", help="cuda, cpu or auto (default auto)")
    g.add_argument("--seq-len", type=int, default=1024, help="training window in tokens (default 1024)")
    g.add_argument("--batch-size", type=int, default=32, help="windows per step (default 32)")
    g.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default 2e-3)")
    g.add_argument("--min-lr-ratio", type=float, default=0.1, help="final lr as a fraction of peak (default 0.1)")
    g.add_argument("--warmup", type=int, default=100, help="linear warmup steps (default 100)")
    g.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay on matrices (default 0.1)")
    g.add_argument("--beta1", type=float, default=0.9, help="AdamW beta1 (default 0.9)")
    g.add_argument("--beta2", type=float, default=0.95, help="AdamW beta2 (default 0.95)")
    g.add_argument("--grad-clip", type=float, default=1.0, help="gradient norm clip (default 1.0)")
    g.add_argument("--dropout", type=float, default=0.1,
                   help="attention dropout and residual-branch dropout, training only (default 0.1)")
    g.add_argument("--epochs", type=float, default=20.0, help="schedule length in epochs of the train split (default 20)")
    g.add_argument("--max-steps", type=int, default=0, help="schedule length in steps; overrides --epochs if > 0")
    g.add_argument("--time-budget", type=float, default=240.0,
                   help="wall-clock budget in seconds; the cosine schedule follows max(step, time) progress "
                        "and training stops when either runs out (0 = no time limit; default 240)")
    g.add_argument("--eval-every", type=int, default=100, help="evaluate train/val loss every N steps (default 100)")
    g.add_argument("--eval-batch", type=int, default=32, help="windows per eval forward (default 32)")
    g.add_argument("--amp", choices=["bf16", "none"], default="bf16", help="autocast on CUDA (default bf16)")
    g.add_argument("--save-dtype", choices=["float16", "bfloat16", "float32"], default="float16",
                   help="dtype of the saved weights (default float16)")
    g.add_argument("--limit-tokens", type=int, default=0, help="use only the first N train tokens (dry runs)")
    g.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
