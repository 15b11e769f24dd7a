#!/usr/bin/env python3
"""Makes an FP8 block-scaled copy of a tiny reference fixture and its oracle, as deepseek-v3-fp8-tiny was made.

Every linear weight inside model.layers.* becomes float8_e4m3fn with a float32 `weight_scale_inv` per 128 x 128 block
(scale = the block's max |w| / 448, values rounded to nearest by torch's cast), as DeepSeek-V3's checkpoint stores
them; embeddings, norms and lm_head stay as they are. config.json gains DeepSeek-V3's quantization_config. The oracle
(expected.safetensors) is Hugging Face transformers in float32 on the CPU over the dequantized weights
(w = fp8 * scale_inv per block), on the source fixture's four prompts: the logits at every position of the whole
prompt, and 16 greedy steps, each a full forward pass with argmax.

Needs torch, transformers and safetensors (the GPU machine has them):
  python3 tests/data/tools/make_fp8_fixture.py tests/data/models/llama3-distill-tiny tests/data/models/llama3-distill-fp8-tiny
"""
import json
import os
import re
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

BLOCK = 128
LINEAR = re.compile(r"^model\.layers\.\d+\.(self_attn|mlp)\.[a-z_]+_proj\.weight$")


def quantize(w):
    """w [out, in] -> (e4m3 [out, in], scale_inv f32 [ceil(out/128), ceil(in/128)], dequantized f32)."""
    w = w.float()
    out, inp = w.shape
    rows, cols = -(-out // BLOCK), -(-inp // BLOCK)
    scale = torch.empty(rows, cols, dtype=torch.float32)
    q = torch.empty(out, inp, dtype=torch.float8_e4m3fn)
    deq = torch.empty(out, inp, dtype=torch.float32)
    for i in range(rows):
        for j in range(cols):
            blk = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
            s = blk.abs().max().item() / 448.0
            s = s if s > 0 else 1.0
            qb = (blk / s).to(torch.float8_e4m3fn)
            scale[i, j] = s
            q[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = qb
            deq[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = qb.float() * scale[i, j]
    return q, scale, deq


def main(src, dst):
    os.makedirs(dst, exist_ok=True)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    quantized, dequantized = {}, {}
    for name, t in tensors.items():
        if LINEAR.match(name):
            q, s, deq = quantize(t)
            quantized[name] = q
            quantized[name + "_scale_inv"] = s
            dequantized[name] = deq
        else:
            quantized[name] = t
            dequantized[name] = t.float()
    save_file(quantized, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [BLOCK, BLOCK]}
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")

    expected = load_file(os.path.join(src, "expected.safetensors"))
    plain = dict(cfg)
    del plain["quantization_config"]
    plain["torch_dtype"] = "float32"
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(plain, f)
        save_file(dequantized, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
        torch.set_grad_enabled(False)
        for k in range(4):
            ids = expected[f"case{k}.input_ids"].to(torch.int64)
            logits = model(ids[None]).logits[0].float()
            seq = ids.clone()
            greedy = []
            for _ in range(16):
                nxt = int(model(seq[None]).logits[0, -1].argmax())
                greedy.append(nxt)
                seq = torch.cat([seq, torch.tensor([nxt])])
            out[f"case{k}.input_ids"] = ids
            out[f"case{k}.logits"] = logits.contiguous()
            out[f"case{k}.greedy"] = torch.tensor(greedy, dtype=torch.int64)
            last = logits[-1].sort(descending=True).values
            print(f"[{os.path.basename(dst)}] case{k} T={ids.numel()} logit_std={logits.std().item():.3f} "
                  f"last_top1_margin={(last[0] - last[1]).item():.4f} greedy={greedy}")
    save_file(out, os.path.join(dst, "expected.safetensors"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
