#!/usr/bin/env python3
"""Turns the raw outputs of bench/perf_round.sh into headline figures.

Each figure is written in two places:
  - a round's results file (bench/results/DATE-NAME.json: commit, machine, commands, every figure);
  - the card's baseline, bench/baselines/CARD.json (bench/schemas/baseline.schema.json), which keeps the newest
    figure of each name: a figure replaces its name's entry, other names stay.

A figure's peer is measured in the same device call as the figure itself: llama-bench and llama-batched-bench in the
same part's peer.jsonl, PyTorch's MLA decode in mla_peer.jsonl (bench/peers/mla_torch.py), or fathom's own bf16-KV
run for the FP8-KV figure. Never an older number. Qwen-7B's llama.cpp peer is qwen7b-shape (its dimensions in
llama.cpp's llama architecture: bench/peers/llama_cpp.sh).

  bench/summary.py --raw RAW_DIR [RAW_DIR ...] --commit abc1234 --date 2026-12-05 \\
      --machine "one NVIDIA H200 (sm_90a)" --source bench/results/2026-12-05-perf.json \\
      [--baseline bench/baselines/h200.json] [--card "NVIDIA H200"]
      (another card's figures go to its own baseline: --baseline bench/baselines/h100-sxm.json with --machine naming
      "NVIDIA H100 80GB HBM3")

A RAW_DIR is one part's OUT_DIR:
  - NAME.json and NAME.command for each fathom bench run (offline, or online: NAME-online-cC against fathom serve);
  - peer.jsonl, with llama-bench's and llama-batched-bench's lines; mla_peer.jsonl, with PyTorch's;
  - kernels.jsonl and kernels.command from cuda_kernel_bench --ops.
Once the figures are written, pack the raw directories into one file for the round (bench/results/README.md).

A figure whose run is missing is skipped and listed on stderr. The targets are the performance issue's. A figure
records whether it met its target, and which one. A missed one needs its reason (missed_because) written into the
baseline by hand: tests/bench/baselines_test.py fails until it is there.
"""
import argparse
import json
import os
import sys

QWEN, LLAMA, V2 = "qwen7b", "llama8b", "v2lite"
QWEN_PEER = "qwen7b-shape-f16"  # llama.cpp on Qwen-7B's dimensions (bench/peers/llama_cpp.sh)


def level(runs, run, batch):
    """The level of fathom bench run `run` at `batch` sequences, or None."""
    r = runs.get(run)
    if r is None:
        return None
    for lv in r["json"].get("levels", []):
        if lv.get("batch_size") == batch:
            return lv
    return None


def llama_bench(peers, model, n_prompt, n_gen):
    """llama-bench's average tokens/s for `model` (PRESET-DTYPE) at pp n_prompt or tg n_gen, or None."""
    for p in peers:
        if p.get("tool") == "llama-batched-bench":
            continue
        name = os.path.basename(str(p.get("model_filename", "")))
        if name == f"{model}.gguf" and p.get("n_prompt") == n_prompt and p.get("n_gen") == n_gen:
            return p.get("avg_ts")
    return None


def batched_bench(peers, model, pl, pp=512, key="speed_tg"):
    """llama-batched-bench's decode (speed_tg) or prefill (speed_pp) throughput for `model` at `pl` sequences of `pp`
    prompt tokens, or None."""
    for p in peers:
        if (p.get("tool") == "llama-batched-bench" and p.get("model") == model and p.get("pl") == pl
                and p.get("pp") == pp):
            return p.get(key)
    return None


def kernel_row(kernels, op, shape_part, dtypes, variant="default"):
    """The cuda_kernel_bench --ops row of `op` whose shape contains `shape_part`, or None."""
    for k in kernels:
        if (k.get("op") == op and shape_part in k.get("shape", "") and k.get("dtypes") == dtypes
                and k.get("variant") == variant and "gb_s" in k):
            return k
    return None


def add_peer(f, label, value, digits=1):
    """Figure f with its peer's label and value, when the peer was measured (value not None)."""
    if value is not None:
        f["peer"], f["peer_value"] = label, round(value, digits)
    return f


def decode_figure(name, run, batch, target_min, peer=None, target_ratio=None):
    """A decode throughput figure (tok/s) from run/batch, against a peer function of (runs, peers) -> (label, value)."""

    def make(runs, peers, kernels):
        lv = level(runs, run, batch)
        if lv is None:
            return None
        f = {"value": round(lv["decode_tokens_per_s"], 1), "unit": "tok/s",
             "roofline": round(lv["roofline"]["theoretical_tokens_per_s"], 1), "run": run}
        if lv["roofline"].get("mbu") is not None:
            f["mbu"] = round(lv["roofline"]["mbu"], 3)
        if peer is not None:
            add_peer(f, *peer(runs, peers))
        f["target"], f["met"] = target(f["value"], f.get("peer_value"), target_min, target_ratio, "tok/s")
        return f

    return name, make


def target(value, peer_value, at_least=None, ratio_at_least=None, unit="", at_most=None):
    """The target's text and whether it is met (None when a peer it needs is missing)."""
    parts, met = [], True
    if at_least is not None:
        parts.append(f">= {at_least:g} {unit}".strip())
        met = met and value >= at_least
    if at_most is not None:
        parts.append(f"<= {at_most:g} {unit}".strip())
        met = met and value <= at_most
    if ratio_at_least is not None:
        parts.append(f">= {ratio_at_least:g}x the peer")
        met = None if not peer_value else (met and value / peer_value >= ratio_at_least)
    if not parts:
        return "", None  # a figure recorded for its ratio, without a target of its own
    return " and ".join(parts), met


def tg128(model):
    return lambda runs, peers: (f"llama.cpp {model} llama-bench tg128 (same call)", llama_bench(peers, model, 0, 128))


def batched(model, pl, pp=512):
    return lambda runs, peers: (
        f"llama.cpp {model} llama-batched-bench -npp {pp} -ntg 128 -npl {pl} speed_tg (same call)",
        batched_bench(peers, model, pl, pp))


def pp512_ms(model):
    """llama-bench's pp512 as the time of one 512-token prefill (ms): the TTFT figure's peer."""

    def peer(runs, peers):
        ts = llama_bench(peers, model, 512, 0)
        return (f"llama.cpp {model} llama-bench pp512, as 512 / tokens per second (same call)",
                1000.0 * 512 / ts if ts else None)

    return peer


def batched_mfu(model):
    """llama-batched-bench's 16 x 512 prefill (speed_pp) as MFU: fathom's MFU times the peer's share of fathom's
    prefill tokens per second (the same model shape, so the same FLOPs a token)."""

    def peer(lv, peers):
        tps = batched_bench(peers, model, 16, 512, "speed_pp")
        if not tps or not lv.get("prefill_tokens_per_s"):
            return None, None
        return (f"llama.cpp {model} llama-batched-bench -npp 512 -npl 16 speed_pp (same call), as MFU",
                100 * lv["prefill_mfu"] * tps / lv["prefill_tokens_per_s"])

    return peer


def mla_torch(peers, heads):
    """The better of PyTorch's two MLA decodes (bench/peers/mla_torch.py) at `heads`: (label, GB/s) or (None, None)."""
    rows = [p for p in peers if p.get("tool") == "pytorch" and p.get("op") == "mla_decode" and p.get("heads") == heads
            and p.get("gb_s")]
    if not rows:
        return None, None
    best = max(rows, key=lambda p: p["gb_s"])
    return f"PyTorch {best.get('torch', '')} {best['method']} on the same latent cache (same call)", best["gb_s"]


def bf16_kv(batch):
    def peer(runs, peers):
        lv = level(runs, "qwen7b-1k", batch)
        return ("fathom, bf16 KV cache (same call)", lv["decode_tokens_per_s"] if lv else None)

    return peer


def prefill_mfu(name, run, at_least, peer=None):
    def make(runs, peers, kernels):
        lv = level(runs, run, 16)
        if lv is None:
            return None
        value = round(100 * lv["prefill_mfu"], 1)
        t, met = target(value, None, at_least, None, "%")
        f = {"value": value, "unit": "% MFU (16 x 512-token prefill)", "roofline": 100.0, "run": run,
             "target": t, "met": met}
        return add_peer(f, *peer(lv, peers)) if peer is not None else f

    return name, make


def ttft(name, run, at_most, peer=None):
    def make(runs, peers, kernels):
        lv = level(runs, run, 1)
        if lv is None:
            return None
        value = round(lv["ttft_ms"]["median"], 2)
        t, met = target(value, None, None, None, "ms", at_most=at_most)
        f = {"value": value, "unit": "ms (median TTFT, 512-token prompt; lower is better)", "roofline": None,
             "run": run, "target": t, "met": met, "better": "lower"}
        return add_peer(f, *peer(runs, peers), digits=2) if peer is not None else f

    return name, make


MLA_CACHE_BYTES = 64 * 4096 * 576 * 2  # the 64 x 4k rows' bf16 latent cache
# HBM read bandwidth (GB/s) by the GPU the --machine text names: the H200's measured 4.5 TB/s, the H100 SXM's spec
# sheet 3.35 TB/s (KnownGpuPeaks in src/bench/roofline.cc holds the same for fathom bench). The H200's for any other.
HBM_GBS = (("H100", 3350.0), ("H200", 4500.0))


def hbm_roofline(machine):
    for gpu, gbs in HBM_GBS:
        if gpu in (machine or ""):
            return gbs
    return 4500.0


def mla_bw(name, heads, at_least):
    def make(runs, peers, kernels):
        row = kernel_row(kernels, "PagedAttention", f"heads={heads}/1 k=576 v=512 (V in K) batch=decode[64x(4095+1)]",
                         "q=f32 cache=bf16")
        if row is None:
            return None
        # The latent cache's bytes over the row's time, as PyTorch's figure counts them: the row's own gb_s also counts
        # the float32 Q and output (12% more bytes at 128 heads).
        value = round(MLA_CACHE_BYTES / row["us"] / 1e3, 1)
        t, met = target(value, None, at_least, None, "GB/s")
        # roofline: the machine's HBM, which compute() fills in for every GB/s figure
        f = {"value": value, "unit": "GB/s of latent cache (64 sequences x 4k)", "roofline": None,
             "run": "kernels", "target": t, "met": met}
        return add_peer(f, *mla_torch(peers, heads))

    return name, make


def online_level(runs_online, name, c):
    """output tok/s and p50 TTFT of the online run NAME-online-cC, or None."""
    r = runs_online.get(f"{name}-online-c{c}")
    if r is None or not r["json"].get("levels"):
        return None
    return r["json"]["levels"][0]


def online_figure(name, model, c):
    """Output throughput at concurrency c against `fathom serve` (512 in, 256 out)."""

    def make(runs, peers, kernels):
        lv = online_level(runs, model, c)
        if lv is None:
            return None
        return {"value": round(lv["output_throughput"], 1),
                "unit": f"output tok/s at concurrency {c} (512 in, 256 out)", "roofline": None,
                "run": f"{model}-online-c{c}", "target": "", "met": None}

    return name, make


def online_vs_offline(name, model):
    """Concurrency 1 online against the offline batch-1 run of the same lengths: within 5%."""

    def make(runs, peers, kernels):
        lv = online_level(runs, model, 1)
        off = level(runs, f"{model}-offline-b1-256", 1)
        if lv is None or off is None:
            return None
        value = round(lv["output_throughput"], 1)
        f = {"value": value, "unit": "output tok/s at concurrency 1 (512 in, 256 out)", "roofline": None,
             "run": f"{model}-online-c1", "peer": "fathom offline batch 1, 512 in, 256 out (same call)",
             "peer_value": round(off["decode_tokens_per_s"], 1)}
        f["target"], f["met"] = target(value, f["peer_value"], None, 0.95, "")
        f["target"] = "within 5% of the offline batch-1 figure (>= 0.95x)"
        return f

    return name, make


# The headline figures (the performance issue's names and targets).
FIGURES = [
    decode_figure("qwen7b_bf16_b1_decode", "qwen7b-512", 1, 270, tg128(QWEN_PEER)),
    decode_figure("llama8b_bf16_b1_decode", "llama8b-512", 1, 255, tg128("r1-distill-llama-8b-f16"), 1.2),
    decode_figure("llama8b_bf16_b64_decode", "llama8b-512", 64, None, batched("r1-distill-llama-8b-f16", 64)),
    decode_figure("llama8b_bf16_b256_decode", "llama8b-512", 256, None, batched("r1-distill-llama-8b-f16", 256)),
    decode_figure("qwen7b_bf16_b64_decode", "qwen7b-1k", 64, 12000, batched(QWEN_PEER, 64, 1024)),
    decode_figure("qwen7b_bf16_b256_decode", "qwen7b-1k", 256, 24000, batched(QWEN_PEER, 256, 1024)),
    decode_figure("qwen7b_fp8kv_b64_decode", "qwen7b-1k-fp8kv", 64, None, bf16_kv(64)),
    decode_figure("qwen7b_fp8kv_b256_decode", "qwen7b-1k-fp8kv", 256, None, bf16_kv(256), 1.3),
    prefill_mfu("qwen7b_bf16_prefill8k_mfu", "qwen7b-prefill8k", 55, batched_mfu(QWEN_PEER)),
    ttft("qwen7b_ttft_512", "qwen7b-512", 15, pp512_ms(QWEN_PEER)),
    decode_figure("v2lite_bf16_b1_decode", "v2lite-512", 1, 600, tg128("deepseek-v2-lite-f16"), 2.5),
    decode_figure("v2lite_bf16_b64_decode", "v2lite-512", 64, 8000, batched("deepseek-v2-lite-f16", 64)),
    decode_figure("v2lite_bf16_b256_decode", "v2lite-512", 256, 20000, batched("deepseek-v2-lite-f16", 256)),
    prefill_mfu("v2lite_prefill8k_mfu", "v2lite-prefill8k", 35, batched_mfu("deepseek-v2-lite-f16")),
    mla_bw("mla_decode_bw_16h", 16, 3000),
    mla_bw("mla_decode_bw_128h", 128, 2500),
    online_vs_offline("qwen7b_online_c1_vs_offline_b1", QWEN),
    online_figure("qwen7b_online_c16_output", QWEN, 16),
    online_figure("qwen7b_online_c64_output", QWEN, 64),
    online_figure("qwen7b_online_c256_output", QWEN, 256),
    online_vs_offline("v2lite_online_c1_vs_offline_b1", V2),
    online_figure("v2lite_online_c16_output", V2, 16),
    online_figure("v2lite_online_c64_output", V2, 64),
    online_figure("v2lite_online_c256_output", V2, 256),
]


def read_jsonl(path):
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass  # a line cut short by a timeout
    return rows


def load_raw(dirs):
    """fathom runs by name ({"json", "command"}), peer lines and kernel rows, over every raw directory."""
    runs, peers, kernels, commands = {}, [], [], {}
    for d in dirs:
        for f in sorted(os.listdir(d)):
            if f.endswith(".json"):
                name = f[:-len(".json")]
                with open(os.path.join(d, f)) as fh:
                    try:
                        j = json.load(fh)
                    except json.JSONDecodeError:
                        continue
                if j.get("mode") not in ("offline", "online"):
                    continue
                cmd_path = os.path.join(d, name + ".command")
                cmd = open(cmd_path).read().strip() if os.path.exists(cmd_path) else ""
                runs[name] = {"json": j, "command": cmd}
        peers += read_jsonl(os.path.join(d, "peer.jsonl")) + read_jsonl(os.path.join(d, "mla_peer.jsonl"))
        kernels += read_jsonl(os.path.join(d, "kernels.jsonl"))
        if os.path.exists(os.path.join(d, "kernels.command")):
            commands["kernels"] = open(os.path.join(d, "kernels.command")).read().strip()
    for name, r in runs.items():
        commands[name] = r["command"]
    return runs, peers, kernels, commands


def compute(runs, peers, kernels, commands, commit, date, source, machine=None, card=""):
    """The figures, each in the baseline's form (bench/schemas/baseline.schema.json), and the names not measured."""
    figures, missing = [], []
    rnd = os.path.basename(source)[:-len(".json")] if source.endswith(".json") else os.path.basename(source)
    for name, make in FIGURES:
        f = make(runs, peers, kernels)
        if f is None:
            missing.append(name)
            continue
        if f["unit"].startswith("GB/s"):  # a bandwidth figure's roofline is the machine's HBM
            f["roofline"] = hbm_roofline(machine)
        out = {"name": name, "value": f["value"], "unit": f["unit"], "better": f.get("better", "higher")}
        if "mbu" in f:
            out["mbu"] = f["mbu"]
        out.update({"roofline": f["roofline"], "peer": f.get("peer"), "peer_value": f.get("peer_value"),
                    "peer_same_lease": True if f.get("peer_value") is not None else None, "ratio": None})
        if out["peer_value"]:
            out["ratio"] = round(out["value"] / out["peer_value"], 3)
        else:
            out["peer"] = None
            out["peer_note"] = "no peer line for this figure in the call's raw outputs"
        out.update({"target": f["target"], "met": f["met"], "commit": commit, "date": date, "card": card,
                    "command": commands.get(f["run"], ""), "round": rnd})
        figures.append(out)
    return figures, missing


def merge_baseline(baseline, figures):
    """The baseline with each figure replacing the entry of its name (new names appended, others kept in order)."""
    by_name = {f["name"]: f for f in figures}
    merged = []
    for old in baseline.get("figures", []):
        merged.append(by_name.pop(old["name"], old))
    merged += [f for f in figures if f["name"] in by_name]
    baseline["figures"] = merged
    return baseline


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw", nargs="+", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--date", required=True)
    ap.add_argument("--machine", default="one NVIDIA H200 (sm_90a) through the device tool")
    ap.add_argument("--source", required=True, help="the results file to write (bench/results/DATE-NAME.json)")
    ap.add_argument("--baseline", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "baselines",
                                                      "h200.json"),
                    help="the card's baseline the figures replace theirs in (bench/baselines/CARD.json)")
    ap.add_argument("--card", help="the GPU's name as nvidia-smi gives it; by default the baseline's own card, which "
                                   "--machine must name (needed when the baseline does not exist yet)")
    a = ap.parse_args(argv)
    baseline = None
    if os.path.exists(a.baseline):
        with open(a.baseline) as f:
            baseline = json.load(f)
    card = a.card or (baseline or {}).get("card")
    if not card:
        print(f"{a.baseline} does not exist: name its card with --card", file=sys.stderr)
        return 1
    if baseline is not None and baseline.get("card") != card:
        print(f"{a.baseline} holds {baseline.get('card')}'s figures, not {card}'s", file=sys.stderr)
        return 1
    if card not in a.machine:
        print(f"--machine ({a.machine}) does not name the card {card}: pick the card's baseline", file=sys.stderr)
        return 1
    runs, peers, kernels, commands = load_raw(a.raw)
    figures, missing = compute(runs, peers, kernels, commands, a.commit, a.date, a.source, a.machine, card)
    if not figures:
        print("no figure could be computed from " + " ".join(a.raw), file=sys.stderr)
        return 1
    result = {"name": "performance round: headline figures with same-call peers (bench/perf_round.sh)",
              "date": a.date, "commit": a.commit, "machine": a.machine, "card": card, "raw": a.raw,
              "commands": commands, "peer_lines": peers, "figures": figures, "missing": missing}
    with open(a.source, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    if baseline is None:
        stem = os.path.basename(a.baseline)[:-len(".json")]
        baseline = {"name": stem, "kind": "gpu", "card": card, "machine": a.machine,
                    "note": "The current headline figures on this card (bench/schemas/baseline.schema.json).",
                    "schema": "bench/schemas/baseline.schema.json", "figures": []}
    with open(a.baseline, "w") as f:
        json.dump(merge_baseline(baseline, figures), f, indent=1, ensure_ascii=False)
        f.write("\n")
    for fig in figures:
        ratio = f" ({fig['ratio']}x {fig['peer']})" if fig["ratio"] is not None else ""
        state = {True: "met", False: "MISSED", None: "no target" if not fig["target"] else "no peer"}[fig["met"]]
        print(f"{fig['name']}: {fig['value']} {fig['unit']}{ratio}; target {fig['target'] or '-'}: {state}")
        if fig["met"] is False:
            print(f"{fig['name']}: missed; write why (missed_because) in {a.baseline}", file=sys.stderr)
    for name in missing:
        print(f"{name}: not measured (its run is missing)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
