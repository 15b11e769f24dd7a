#!/usr/bin/env python3
"""Makes a tiny oracle fixture in a family's Hugging Face hub layout, or re-records an existing fixture's oracle.

  new:    config.json (a real one shrunk with --shrink / --set, or a tiny one) + seed -> a random-weight checkpoint
          (AutoModelForCausalLM.from_config in float32, save_pretrained with safetensors, the hub-style config.json
          written back as given), reloaded with from_pretrained(output_loading_info=True): no missing, unexpected or
          mismatched keys and no error messages, and the reloaded model gives the in-memory model's logits exactly.
          Then the oracle (below) into expected.safetensors, and FIXTURE.json saying how it was made.
  oracle: the oracle alone, for an existing checkpoint folder, into --out; --compare <expected.safetensors> prints
          the max |dlogit| per case and the first differing greedy step (exit status 1 when they differ).

The oracle is that of tests/data/models/README.md: transformers in float32 on the CPU, for each prompt the logits at
every position of the whole prompt, then 16 greedy steps, each a full forward (use_cache=False) with argmax. FP8
block-scaled checkpoints run on a dequantized float32 twin (w = fp8 * weight_scale_inv[r // 128, c // 128]).
Prompts: case{k}.input_ids of --prompts-from's expected.safetensors, else of --compare's file, else of the
checkpoint's own expected.safetensors (oracle mode), else random ids of lengths 1, 6, 23 and 80 drawn with the seed.

Weights take the shared reference fixtures' scales: embeddings N(0, 1), lm_head and router gates N(0, 2/sqrt(fan_in)),
other matrices N(0, 1/sqrt(fan_in)), norms 1 + N(0, 0.1), biases N(0, 0.2), e_score_correction_bias N(0, 0.25);
rounded to bf16 and stored so unless --weights f32. Running a mode needs torch, transformers and safetensors (the GPU
machine has them: torch 2.11, transformers 5.17); --help does not:
  python3 scripts/make_fixture.py new --config ../shared/reference/configs/deepseek-v3.json --shrink \\
      --set rope_scaling.original_max_position_embeddings=128 --seed 7 --out tests/data/models/deepseek-v3-new-tiny
  python3 scripts/make_fixture.py oracle tests/data/models/qwen2-distill-tiny --out /tmp/q.safetensors \\
      --compare tests/data/models/qwen2-distill-tiny/expected.safetensors
Then add the fixture's entry to tests/data/models/registry.json (`new` prints one).
"""
import argparse
import datetime
import json
import os
import re
import shlex
import sys
import tempfile

SCRIPT = "scripts/make_fixture.py"
LENGTHS = (1, 6, 23, 80)
GREEDY_STEPS = 16
# --shrink: each key present (and not null) becomes min(its value, this).
SHRINK = {"vocab_size": 512, "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 32,
          "num_attention_heads": 4, "head_dim": 32, "max_position_embeddings": 8192, "q_lora_rank": 48,
          "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "n_routed_experts": 16,
          "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2, "first_k_dense_replace": 1,
          "num_nextn_predict_layers": 0, "index_n_heads": 4, "index_head_dim": 32, "index_topk": 8}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    new = sub.add_parser("new", help="a new random-weight checkpoint and its oracle")
    new.add_argument("--config", required=True, help="a config.json in hub layout")
    new.add_argument("--out", required=True, help="the fixture folder to write (must be empty or absent)")
    new.add_argument("--seed", type=int, required=True)
    new.add_argument("--shrink", action="store_true", help="shrink a real config's dimensions (SHRINK)")
    new.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="set a config key (VALUE as JSON, else a string; a.b for nested keys), after --shrink")
    new.add_argument("--weights", choices=("bf16", "f32"), default="bf16")
    new.add_argument("--prompts-from", metavar="FIXTURE_DIR", help="take the prompts of this fixture")
    orc = sub.add_parser("oracle", help="re-record the oracle of an existing checkpoint folder")
    orc.add_argument("checkpoint")
    orc.add_argument("--out", required=True, help="the expected.safetensors to write")
    orc.add_argument("--seed", type=int, default=0, help="for random prompts only")
    orc.add_argument("--prompts-from", metavar="FIXTURE_DIR", help="take the prompts of this fixture")
    orc.add_argument("--compare", metavar="EXPECTED", help="an expected.safetensors to compare the result with")
    orc.add_argument("--tol", type=float, default=1e-4, help="--compare: the largest |dlogit| that agrees")
    return p.parse_args(argv)


def shrink(cfg):
    for key, tiny in SHRINK.items():
        if isinstance(cfg.get(key), int) and not isinstance(cfg.get(key), bool):
            cfg[key] = min(cfg[key], tiny)
    heads, kv = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads")
    if isinstance(kv, int):  # MLA and MHA keep kv heads = heads; GQA keeps a group
        cfg["num_key_value_heads"] = heads if cfg.get("kv_lora_rank") or kv >= heads else min(kv, 2)
    cfg["num_hidden_layers"] = min(cfg.get("num_hidden_layers", 2), 3 if cfg.get("first_k_dense_replace") else 2)
    if "max_window_layers" in cfg:
        cfg["max_window_layers"] = cfg["num_hidden_layers"]


def apply_set(cfg, items):
    for item in items:
        key, _, text = item.partition("=")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        *path, last = key.split(".")
        node = cfg
        for k in path:
            node = node.setdefault(k, {})
        node[last] = value


def read_prompts(path):
    """{k: case{k}.input_ids} (an oracle_rerun file holds only some cases)."""
    from safetensors.torch import load_file
    t = load_file(path)
    return {k: t[f"case{k}.input_ids"].long() for k in range(100) if f"case{k}.input_ids" in t}


def prompts_for(args, vocab, default_file=None):
    import torch
    for path in (args.prompts_from and os.path.join(args.prompts_from, "expected.safetensors"),
                 getattr(args, "compare", None), default_file):
        if path and os.path.exists(path):
            ids = read_prompts(path)
            if max(int(i.max()) for i in ids.values()) >= vocab:
                sys.exit(f"{path}: prompt ids reach past vocab_size {vocab}")
            return ids, path
    g = torch.Generator().manual_seed(args.seed + 1)
    prompts = {k: torch.randint(0, vocab, (n,), generator=g) for k, n in enumerate(LENGTHS)}
    return prompts, f"random (seed {args.seed + 1})"


def load_checked(folder):
    """from_pretrained in float32; fails unless the loading info is empty."""
    import torch
    from transformers import AutoModelForCausalLM
    model, info = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, output_loading_info=True)
    absent = [k for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs") if k not in info]
    if absent:
        sys.exit(f"{folder}: from_pretrained's loading info has no {absent} (it has {sorted(info)})")
    bad = {k: v for k, v in info.items() if v}
    if bad:
        sys.exit(f"{folder}: from_pretrained loading info is not empty: {bad}")
    return model.eval(), {k: list(v) for k, v in info.items()}


def dequantized_twin(folder, tmp):
    """For an FP8 block-scaled checkpoint: a float32 twin (DeepSeek's scale[r // b0, c // b1]) in `tmp`."""
    import torch
    from safetensors.torch import load_file, save_file
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    q = cfg.pop("quantization_config")
    if q.get("quant_method") != "fp8" or "weight_block_size" not in q:
        sys.exit(f"{folder}: the oracle knows only fp8 block-scaled quantization, not {q}")
    b0, b1 = q["weight_block_size"]
    tensors = {}
    for name in sorted(os.listdir(folder)):
        if re.fullmatch(r"model.*\.safetensors", name):
            tensors.update(load_file(os.path.join(folder, name)))
    twin = {}
    for name, t in tensors.items():
        if name.endswith("_scale_inv"):
            continue
        if t.dtype == torch.float8_e4m3fn:
            s = tensors[name + "_scale_inv"].float()
            s = s.repeat_interleave(b0, 0)[:t.shape[0]].repeat_interleave(b1, 1)[:, :t.shape[1]]
            twin[name] = t.float() * s
        else:
            twin[name] = t.float()
    cfg["torch_dtype"] = "float32"
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(cfg, f)
    save_file(twin, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    return tmp


def run_oracle(model, prompts, label):
    import torch
    torch.set_grad_enabled(False)
    out, log = {}, []
    for k, ids in sorted(prompts.items()):
        logits = model(ids[None], use_cache=False).logits[0].float()
        seq, greedy = ids.clone(), []
        for _ in range(GREEDY_STEPS):
            nxt = int(model(seq[None], use_cache=False).logits[0, -1].argmax())
            greedy.append(nxt)
            seq = torch.cat([seq, torch.tensor([nxt])])
        out[f"case{k}.input_ids"] = ids.to(torch.int64).contiguous()
        out[f"case{k}.logits"] = logits.contiguous()
        out[f"case{k}.greedy"] = torch.tensor(greedy, dtype=torch.int64)
        last = logits[-1].sort(descending=True).values
        entry = {"T": ids.numel(), "logit_std": round(logits.std().item(), 3),
                 "last_top1_margin": round((last[0] - last[1]).item(), 4), "greedy": greedy}
        print(f"[{label}] case{k} T={entry['T']} logit_std={entry['logit_std']:.3f} "
              f"last_top1_margin={entry['last_top1_margin']:.4f} greedy={greedy}")
        log.append(entry)
    return out, log


def versions():
    import safetensors
    import torch
    import transformers
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "safetensors": safetensors.__version__, "python": sys.version.split()[0]}


def oracle_metadata(v):
    return {"oracle": f"transformers {v['transformers']} torch {v['torch']} float32 cpu", "made_by": SCRIPT,
            "command": shlex.join([SCRIPT] + sys.argv[1:])}


def compare(got, path, tol):
    from safetensors.torch import load_file
    want, bad = load_file(path), False
    for k in (k for k in range(100) if f"case{k}.input_ids" in want):  # oracle_rerun files hold some cases
        if f"case{k}.input_ids" not in got or not want[f"case{k}.input_ids"].equal(got[f"case{k}.input_ids"]):
            print(f"case{k}: other input ids than {path}")
            bad = True
            continue
        d = (want[f"case{k}.logits"] - got[f"case{k}.logits"]).abs().max().item()
        a, b = want[f"case{k}.greedy"].tolist(), got[f"case{k}.greedy"].tolist()
        step = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        print(f"case{k}: max |dlogit| {d:.3g}; greedy " +
              ("all equal" if step is None else f"first differs at step {step} ({a[step]} in the file, {b[step]} now)"))
        bad = bad or d > tol or step is not None
    return bad


def init_weights(model, seed, bf16):
    """The shared fixtures' value scales (module docstring), by name in sorted order; rounded to bf16 if `bf16`."""
    import torch
    g = torch.Generator().manual_seed(seed)
    saved = dict(model.named_parameters())
    saved.update((n, b) for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    with torch.no_grad():
        for name, p in sorted(saved.items()):
            if p.dim() >= 2:
                wide = name == "lm_head.weight" or re.search(r"\.gate\.weight$", name)
                std = 1.0 if "embed_tokens" in name else (2.0 if wide else 1.0) / p.shape[-1] ** 0.5
            else:
                std = 0.1 if "norm" in name else 0.25 if name.endswith("e_score_correction_bias") else 0.2
            value = torch.randn(p.shape, generator=g) * std + (1.0 if p.dim() == 1 and "norm" in name else 0.0)
            p.copy_(value.to(torch.bfloat16).float() if bf16 else value)


def suggested_entry(name, cfg, tensors):
    feats = set()
    if any(cfg.get(k) for k in ("n_routed_experts", "num_experts", "num_local_experts")):
        feats.add("moe")
        if cfg.get("topk_method"):
            feats.add(cfg["topk_method"].replace("_", "-") + "-routing")
    feats |= {f for f, on in (("shared-experts", cfg.get("n_shared_experts")), ("q-lora", cfg.get("q_lora_rank")),
                              ("tied-embeddings", cfg.get("tie_word_embeddings") is True)) if on}
    if all(f"model.layers.0.self_attn.{p}_proj.bias" in tensors for p in "qkv"):
        feats.add("qkv-bias")
    rope = (cfg.get("rope_scaling") or {}).get("rope_type") or (cfg.get("rope_scaling") or {}).get("type")
    if rope and rope != "default":
        feats.add("rope-" + rope)
    dtypes = sorted({{"torch.bfloat16": "BF16", "torch.float32": "F32"}.get(str(t.dtype), str(t.dtype))
                     for t in tensors.values()})
    return {"name": name, "family": cfg["model_type"], "architecture": cfg["architectures"][0],
            "format": {"BF16": "bf16", "F32": "f32"}.get(dtypes[0], "?") if len(dtypes) == 1 else "?",
            "tensor_dtypes": dtypes,
            "attention": "mla" if cfg.get("kv_lora_rank") else "gqa", "features": sorted(feats),
            "origin": "made here by " + SCRIPT, "oracle": "made with the checkpoint: FIXTURE.json"}


def main_new(args):
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig, AutoModelForCausalLM
    if os.path.exists(args.out) and os.listdir(args.out):
        sys.exit(f"{args.out} exists and is not empty")
    with open(args.config) as f:
        cfg = json.load(f)
    if cfg.pop("quantization_config", None):
        print("quantization_config dropped: make the quantized twin with tests/data/tools/make_fp8_fixture.py")
    if args.shrink:
        shrink(cfg)
    apply_set(cfg, args.set)
    cfg["torch_dtype"] = "bfloat16" if args.weights == "bf16" else "float32"
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(cfg, f)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp), dtype=torch.float32).eval()
    init_weights(model, args.seed, args.weights == "bf16")
    prompts, prompts_origin = prompts_for(args, cfg["vocab_size"])
    with torch.no_grad():
        before = model(prompts[max(prompts)][None], use_cache=False).logits
    (model.to(torch.bfloat16) if args.weights == "bf16" else model).save_pretrained(args.out, safe_serialization=True)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(args.out, extra)):
            os.remove(os.path.join(args.out, extra))
    with open(os.path.join(args.out, "config.json"), "w") as f:  # the hub-style keys, not transformers' rewrite
        json.dump(cfg, f, indent=2)
        f.write("\n")
    model, info = load_checked(args.out)
    with torch.no_grad():
        moved = (model(prompts[max(prompts)][None], use_cache=False).logits - before).abs().max().item()
    if moved > 1e-5:
        sys.exit(f"{args.out}: the reloaded checkpoint's logits differ from the saved model's by {moved}")
    name = os.path.basename(os.path.normpath(args.out))
    out, log = run_oracle(model, prompts, name)
    v = versions()
    save_file(out, os.path.join(args.out, "expected.safetensors"), metadata=oracle_metadata(v))
    tensors = {}
    for f in sorted(os.listdir(args.out)):
        if re.fullmatch(r"model.*\.safetensors", f):
            tensors.update(load_file(os.path.join(args.out, f)))
    with open(os.path.join(args.out, "FIXTURE.json"), "w") as f:
        json.dump({"made_by": SCRIPT, "command": shlex.join([SCRIPT] + sys.argv[1:]), "mode": "new",
                   "seed": args.seed, "config": args.config, "shrink": args.shrink, "set": args.set,
                   "weights": args.weights, "prompts": prompts_origin, **v,
                   "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   "loading_info": info, "oracle": "float32 cpu, whole-prompt logits, 16 full-forward greedy steps",
                   "cases": log}, f, indent=2)
        f.write("\n")
    print("registry entry for tests/data/models/registry.json:")
    print(json.dumps(suggested_entry(name, cfg, tensors), indent=2))


def main_oracle(args):
    from safetensors.torch import save_file
    with open(os.path.join(args.checkpoint, "config.json")) as f:
        cfg = json.load(f)
    own = os.path.join(args.checkpoint, "expected.safetensors")
    prompts, _ = prompts_for(args, cfg["vocab_size"], own)
    with tempfile.TemporaryDirectory() as tmp:
        folder = dequantized_twin(args.checkpoint, tmp) if cfg.get("quantization_config") else args.checkpoint
        model, _ = load_checked(folder)
        out, _ = run_oracle(model, prompts, os.path.basename(os.path.normpath(args.checkpoint)))
    save_file(out, args.out, metadata=oracle_metadata(versions()))
    if args.compare and compare(out, args.compare, args.tol):
        sys.exit(1)


if __name__ == "__main__":
    a = parse_args(sys.argv[1:])
    if a.mode == "new":
        main_new(a)
    else:
        main_oracle(a)
