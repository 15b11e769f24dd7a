#!/usr/bin/env python3
"""bench/summary.py on made-up raw outputs of bench/perf_round.sh: the figures, their same-call peer ratios, the targets
met and missed, and the merge into a card's baseline (a figure replaces its name's entry; other names stay); and the
layout of bench/results (one summary JSON a round, its raw outputs packed beside it)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import baselines_test  # noqa: E402  (the baseline schema's check)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "summary.py")


def level(batch, tok_s, roofline, ttft_median=20.0, mfu=0.3, prefill_tok_s=None):
    lv = {"batch_size": batch, "decode_tokens_per_s": tok_s, "prefill_mfu": mfu,
          "ttft_ms": {"median": ttft_median},
          "roofline": {"theoretical_tokens_per_s": roofline, "mbu": tok_s / roofline}}
    if prefill_tok_s is not None:
        lv["prefill_tokens_per_s"] = prefill_tok_s
    return lv


def write_run(d, name, levels, command):
    with open(os.path.join(d, name + ".json"), "w") as f:
        json.dump({"mode": "offline", "levels": levels}, f)
    with open(os.path.join(d, name + ".command"), "w") as f:
        f.write(command + "\n")


class SummaryTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        t = self.tmp.name
        self.dense, self.kern = os.path.join(t, "dense"), os.path.join(t, "kernels")
        os.makedirs(self.dense)
        os.makedirs(self.kern)
        write_run(self.dense, "qwen7b-512", [level(1, 250.0, 317.5, ttft_median=14.2)], "fathom bench qwen 512")
        write_run(self.dense, "qwen7b-1k", [level(64, 9000.0, 17000.0), level(256, 20000.0, 30000.0)], "qwen 1k")
        write_run(self.dense, "qwen7b-1k-fp8kv", [level(64, 9900.0, 20000.0), level(256, 27000.0, 40000.0)], "fp8")
        write_run(self.dense, "qwen7b-prefill8k", [level(16, 2500.0, 5000.0, mfu=0.4, prefill_tok_s=32000.0)], "pf")
        write_run(self.dense, "llama8b-512", [level(1, 260.0, 298.3), level(64, 7000.0, 14500.0)], "llama 512")
        write_run(self.dense, "qwen7b-offline-b1-256", [level(1, 220.0, 317.5)], "offline 512/256")
        for c, tok_s in ((1, 207.0), (64, 6000.0)):  # online at concurrency 1: 207 / 220 = 0.941 < 0.95
            with open(os.path.join(self.dense, f"qwen7b-online-c{c}.json"), "w") as f:
                json.dump({"mode": "online", "levels": [{"output_throughput": tok_s}]}, f)
            with open(os.path.join(self.dense, f"qwen7b-online-c{c}.command"), "w") as f:
                f.write(f"fathom serve ...; fathom bench --concurrency {c}\n")
        with open(os.path.join(self.dense, "peer.jsonl"), "w") as f:
            f.write(json.dumps({"model_filename": "/tmp/peer/r1-distill-llama-8b-f16.gguf", "n_prompt": 512,
                                "n_gen": 0, "avg_ts": 9000.0}) + "\n")
            f.write(json.dumps({"model_filename": "/tmp/peer/r1-distill-llama-8b-f16.gguf", "n_prompt": 0,
                                "n_gen": 128, "avg_ts": 200.0}) + "\n")
            f.write(json.dumps({"tool": "llama-batched-bench", "model": "r1-distill-llama-8b-f16", "pl": 64, "pp": 512,
                                "speed_tg": 3500.0}) + "\n")
            # Qwen-7B's peer (qwen7b-shape): tg128, pp512, and batched runs at 512- and 1024-token prompts
            qwen = "/tmp/peer/qwen7b-shape-f16.gguf"
            f.write(json.dumps({"model_filename": qwen, "n_prompt": 0, "n_gen": 128, "avg_ts": 125.0}) + "\n")
            f.write(json.dumps({"model_filename": qwen, "n_prompt": 512, "n_gen": 0, "avg_ts": 25600.0}) + "\n")
            for pl, pp, tg, ppspeed in ((64, 512, 9999.0, 1.0), (64, 1024, 4500.0, 1.0), (16, 512, 1.0, 16000.0)):
                f.write(json.dumps({"tool": "llama-batched-bench", "model": "qwen7b-shape-f16", "pl": pl, "pp": pp,
                                    "speed_tg": tg, "speed_pp": ppspeed}) + "\n")
            f.write('{"tool": "llama-batched-bench", "model": "r1-distill-llama-8b-f16", "pl": 256, "spe\n')  # cut
        with open(os.path.join(self.kern, "kernels.jsonl"), "w") as f:
            f.write(json.dumps({"op": "PagedAttention", "variant": "default", "dtypes": "q=f32 cache=bf16",
                                "shape": "heads=16/1 k=576 v=512 (V in K) batch=decode[64x(4095+1)]",
                                "us": 97.4161, "gb_s": 3150.0}) + "\n")  # gb_s counts Q and the output too
            f.write(json.dumps({"op": "PagedAttention", "variant": "default", "dtypes": "q=f32 cache=bf16",
                                "shape": "heads=128/1 k=576 v=512 (V in K) batch=decode[64x(4095+1)]",
                                "us": 335.544, "gb_s": 1000.0}) + "\n")
        with open(os.path.join(self.kern, "mla_peer.jsonl"), "w") as f:  # PyTorch's MLA decode: the better method
            for heads, method, gb_s in ((16, "sdpa", 1000.0), (16, "bmm", 1550.0), (128, "bmm", 300.0)):
                f.write(json.dumps({"tool": "pytorch", "op": "mla_decode", "heads": heads, "method": method,
                                    "gb_s": gb_s}) + "\n")
            f.write(json.dumps({"tool": "pytorch", "op": "mla_decode", "heads": 128, "method": "sdpa",
                                "error": "not served"}) + "\n")
        with open(os.path.join(self.kern, "kernels.command"), "w") as f:
            f.write("cuda_kernel_bench --ops 1 --filter PagedAttention\n")
        self.baseline = os.path.join(t, "h200.json")
        with open(self.baseline, "w") as f:
            json.dump({"name": "h200", "kind": "gpu", "card": "NVIDIA H200", "machine": "one NVIDIA H200",
                       "note": "kept", "figures": [
                           {"name": "mla_decode_bw_64h", "value": 14.0},
                           {"name": "llama8b_bf16_b1_decode", "value": 1.0, "commit": "old"}]}, f)
        self.source = os.path.join(t, "2026-12-05-perf.json")

    def tearDown(self):
        self.tmp.cleanup()

    def run_summary(self, *raw, extra=()):
        baseline = () if "--baseline" in extra else ("--baseline", self.baseline)
        return subprocess.run([sys.executable, SCRIPT, "--raw", *raw, "--commit", "abc1234", "--date", "2026-12-05",
                               "--source", self.source, *baseline, *extra],
                              capture_output=True, text=True)

    def test_figures_ratios_targets_and_merge(self):
        r = self.run_summary(self.dense, self.kern)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(self.source) as f:
            result = json.load(f)
        figs = {f["name"]: f for f in result["figures"]}
        # batch 1 against llama-bench's tg128 of the same call: 260 / 200
        l1 = figs["llama8b_bf16_b1_decode"]
        self.assertEqual((l1["value"], l1["peer_value"], l1["ratio"]), (260.0, 200.0, 1.3))
        self.assertIn("same call", l1["peer"])
        self.assertTrue(l1["met"])  # >= 255 and >= 1.2x
        self.assertEqual(l1["command"], "llama 512")
        self.assertEqual(l1["roofline"], 298.3)
        # batch 64 against llama-batched-bench's speed_tg at -npl 64
        self.assertEqual(figs["llama8b_bf16_b64_decode"]["ratio"], 2.0)
        self.assertIsNone(figs["llama8b_bf16_b64_decode"]["met"])  # no target of its own
        # the peer line cut short is skipped; its figure still comes out, with no peer
        self.assertIsNone(figs.get("llama8b_bf16_b256_decode"))  # llama8b-512 has no level 256
        q1 = figs["qwen7b_bf16_b1_decode"]  # against llama.cpp on Qwen-7B's shape: 250 / 125
        self.assertEqual((q1["ratio"], q1["met"]), (2.0, False))  # 250 < 270
        self.assertIn("qwen7b-shape-f16", q1["peer"])
        ttft = figs["qwen7b_ttft_512"]  # pp512 at 25600 tok/s: 20 ms for 512 tokens
        self.assertEqual((ttft["peer_value"], ttft["ratio"], ttft["met"]), (20.0, 0.71, True))  # 14.2 <= 15 ms
        q64 = figs["qwen7b_bf16_b64_decode"]  # the 1024-token prompts' line, not the 512's
        self.assertEqual((q64["peer_value"], q64["ratio"]), (4500.0, 2.0))
        self.assertIn("-npp 1024", q64["peer"])
        mfu = figs["qwen7b_bf16_prefill8k_mfu"]  # 40% at 32000 tok/s; the peer's 16000 tok/s is 20%
        self.assertEqual((mfu["value"], mfu["peer_value"], mfu["ratio"], mfu["met"]), (40.0, 20.0, 2.0, False))
        m16, m128 = figs["mla_decode_bw_16h"], figs["mla_decode_bw_128h"]
        # the latent cache's 302 MB over the row's time, not the row's gb_s
        self.assertEqual((m16["value"], m16["peer_value"], m16["ratio"]), (3100.0, 1550.0, 2.0))
        self.assertIn("bmm", m16["peer"])
        self.assertEqual((m128["value"], m128["peer_value"], m128["ratio"]), (900.0, 300.0, 3.0))  # no failed method
        self.assertFalse(figs["qwen7b_bf16_b256_decode"]["met"])  # 20000 < 24000
        fp8 = figs["qwen7b_fp8kv_b256_decode"]  # against the bf16-KV run of the same call: 27000 / 20000
        self.assertEqual((fp8["ratio"], fp8["met"]), (1.35, True))
        self.assertTrue(figs["mla_decode_bw_16h"]["met"])
        self.assertFalse(figs["mla_decode_bw_128h"]["met"])
        self.assertEqual(figs["mla_decode_bw_16h"]["command"], "cuda_kernel_bench --ops 1 --filter PagedAttention")
        for f in result["figures"]:  # the keys, on every figure
            for k in ("name", "value", "unit", "peer", "peer_value", "ratio", "roofline", "commit", "date",
                      "command"):
                self.assertIn(k, f)
            self.assertEqual((f["commit"], f["date"]), ("abc1234", "2026-12-05"))
        self.assertIn("v2lite_bf16_b1_decode", result["missing"])
        online = figs["qwen7b_online_c1_vs_offline_b1"]  # online against offline batch 1 of the same call
        self.assertEqual((online["value"], online["peer_value"], online["ratio"], online["met"]), (207.0, 220.0, 0.941,
                                                                                                   False))
        self.assertEqual(figs["qwen7b_online_c64_output"]["value"], 6000.0)
        self.assertIn("qwen7b_online_c16_output", result["missing"])
        self.assertEqual((l1["card"], l1["round"], l1["better"], l1["mbu"]),
                         ("NVIDIA H200", "2026-12-05-perf", "higher", round(260 / 298.3, 3)))
        self.assertEqual(ttft["better"], "lower")
        self.assertEqual(result["card"], "NVIDIA H200")
        self.assertIn("name", result)  # one convention: the round's description is its name
        with open(self.baseline) as f:
            baseline = json.load(f)
        names = [f["name"] for f in baseline["figures"]]
        self.assertEqual(names[:2], ["mla_decode_bw_64h", "llama8b_bf16_b1_decode"])  # order kept
        self.assertEqual(baseline["figures"][1]["commit"], "abc1234")  # replaced
        self.assertEqual(baseline["figures"][0]["value"], 14.0)  # kept
        self.assertEqual(len(names), len(set(names)))
        self.assertEqual(baseline["note"], "kept")
        self.assertIn("MISSED", r.stdout)
        self.assertIn("qwen7b_bf16_b1_decode: missed; write why", r.stderr)
        # Each new figure conforms to the baseline schema, but for the reason of a missed target, which a person writes.
        baseline["figures"] = result["figures"]
        for path, message in baselines_test.validate_schema(baseline):
            fig = baseline["figures"][path[1]]
            self.assertEqual((path[2:], message, fig["met"]), ([], "'missed_because' is a required property", False),
                             fig["name"])

    def test_another_cards_figures_go_to_its_own_baseline(self):
        h100_path = os.path.join(self.tmp.name, "h100-sxm.json")
        h100_card = ("--card", "NVIDIA H100 80GB HBM3", "--machine", "one NVIDIA H100 80GB HBM3")
        r = self.run_summary(self.dense, self.kern, extra=("--machine", "one NVIDIA H100 80GB HBM3"))
        self.assertEqual(r.returncode, 1)  # the H200's baseline refuses an H100's figures
        self.assertIn("does not name the card NVIDIA H200", r.stderr)
        r = self.run_summary(self.dense, self.kern, extra=("--baseline", h100_path))
        self.assertEqual(r.returncode, 1)  # a new baseline needs its card
        self.assertIn("--card", r.stderr)
        r = self.run_summary(self.dense, self.kern, extra=("--baseline", h100_path, *h100_card))
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(self.baseline) as f:
            self.assertEqual(len(json.load(f)["figures"]), 2)  # the H200's untouched
        with open(h100_path) as f:
            h100 = json.load(f)
        self.assertEqual((h100["name"], h100["card"]), ("h100-sxm", "NVIDIA H100 80GB HBM3"))
        figs = {f["name"]: f for f in h100["figures"]}
        self.assertEqual((figs["llama8b_bf16_b1_decode"]["value"], figs["llama8b_bf16_b1_decode"]["ratio"]),
                         (260.0, 1.3))
        self.assertEqual(figs["mla_decode_bw_16h"]["roofline"], 3350.0)  # the H100's HBM
        self.assertEqual(figs["mla_decode_bw_16h"]["card"], "NVIDIA H100 80GB HBM3")

    def test_nothing_measured_is_an_error(self):
        empty = os.path.join(self.tmp.name, "empty")
        os.makedirs(empty)
        r = self.run_summary(empty)
        self.assertEqual(r.returncode, 1)
        self.assertIn("no figure", r.stderr)
        with open(self.baseline) as f:
            self.assertEqual(len(json.load(f)["figures"]), 2)  # untouched


class ResultsFilesTest(unittest.TestCase):
    """bench/results as a product keeps it: a summary JSON a round (every one parses: a hand edit or a formatter once
    left one unparsable), its raw outputs packed into one ROUND.tar.xz beside it, and no loose raw files."""

    def test_every_round_parses_and_raw_outputs_are_packed(self):
        results = os.path.join(ROOT, "bench", "results")
        names = sorted(os.listdir(results))
        rounds = [n for n in names if n.endswith(".json")]
        self.assertTrue(rounds)
        for name in rounds:
            with open(os.path.join(results, name)) as f:
                try:
                    json.load(f)
                except ValueError as e:
                    self.fail(f"bench/results/{name}: {e}")
        for name in names:
            if name.endswith(".tar.xz"):
                self.assertIn(name[:-len(".tar.xz")] + ".json", rounds, f"bench/results/{name} has no round JSON")
            elif not name.endswith(".json") and name != "README.md":
                self.fail(f"bench/results/{name}: raw outputs go into the round's one ROUND.tar.xz "
                          "(bench/results/README.md)")


if __name__ == "__main__":
    unittest.main()
