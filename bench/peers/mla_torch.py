#!/usr/bin/env python3
"""The MLA decode kernel's same-call peer: PyTorch on the GPU machine, over the same latent cache.

fathom's figure (bench/summary.py's mla_decode_bw_*) is cuda_kernel_bench's PagedAttention row at 64 sequences of 4k
keys, 16 or 128 query heads against one latent row of 576 bf16 values a key (V: its first 512). llama.cpp's trimmed
source builds no op-level benchmark, and FlashMLA is not installed there, so the peer measured in the same call is
PyTorch (cuBLAS and its attention kernels) on the same computation, in the two ways a PyTorch user writes it:
  - sdpa: torch.nn.functional.scaled_dot_product_attention with enable_gqa (the heads share the one latent row);
  - bmm:  scores = q @ kv^T, softmax in float32, then @ kv[..., :512] (the absorbed-MLA decode of vLLM's fallback).
Each prints one JSON line: {"tool": "pytorch", "op": "mla_decode", "heads", "method", "us", "gb_s"} where gb_s counts
the latent cache's bytes once, as fathom's figure does (bench/summary.py: the cache's bytes over the kernel row's
time; the row's own gb_s also counts the float32 Q and output). The two results are compared with each other (max_abs_diff).

  python3 bench/peers/mla_torch.py [--seqs 64] [--ctx 4096] [--heads 16,128] > mla_peer.jsonl
"""
import argparse
import json
import math
import sys

import torch
import torch.nn.functional as F


def time_us(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return 1000.0 * start.elapsed_time(stop) / iters


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--heads", default="16,128")
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    dev = "cuda"
    kv = torch.randn(a.seqs, a.ctx, 576, device=dev, dtype=torch.bfloat16)  # [seqs, ctx, 576]: the latent rows
    cache_bytes = kv.numel() * kv.element_size()
    scale = 1.0 / math.sqrt(192)  # DeepSeek's q/k head dim (128 + 64 rope)
    for heads in [int(h) for h in a.heads.split(",")]:
        q = torch.randn(a.seqs, heads, 576, device=dev, dtype=torch.bfloat16)  # [seqs, heads, 576]

        def bmm():
            s = torch.matmul(q, kv.transpose(1, 2)).float() * scale  # [seqs, heads, ctx]
            p = torch.softmax(s, dim=-1).to(torch.bfloat16)
            return torch.matmul(p, kv[..., :512])  # [seqs, heads, 512]

        q4, k4, v4 = q.unsqueeze(2), kv.unsqueeze(1), kv[..., :512].unsqueeze(1)

        def sdpa():
            # q [seqs, heads, 1, 576], k [seqs, 1, ctx, 576], v [seqs, 1, ctx, 512]
            return F.scaled_dot_product_attention(q4, k4, v4, scale=scale, enable_gqa=True).squeeze(2)

        ref = bmm()
        for name, fn in (("bmm", bmm), ("sdpa", sdpa)):
            row = {"tool": "pytorch", "torch": torch.__version__, "op": "mla_decode", "heads": heads, "seqs": a.seqs,
                   "ctx": a.ctx, "method": name, "device": torch.cuda.get_device_name()}
            try:
                out = fn()
                row["max_abs_diff"] = float((out.float() - ref.float()).abs().max())
                us = time_us(fn, a.iters)
                row["us"] = round(us, 1)
                row["gb_s"] = round(cache_bytes / us / 1e3, 1)
            except (RuntimeError, TypeError) as e:  # a method this PyTorch or shape does not serve
                row["error"] = str(e).splitlines()[0][:200]
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
