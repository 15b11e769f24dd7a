#!/usr/bin/env python3
"""Records DeepSeek's reference encoding of tests/data/chat/deepseek_v32/conversations.json.

DeepSeek-V3.2 ships its prompt format as Python (encoding/encoding_dsv32.py in the checkpoint, `encode_messages`), not
as a Jinja template. This script runs that reference encoder over each conversation and writes expected.json beside
the conversations, which tests/tokenizer/deepseek_v32_encoding_test.cc compares fathom's encoder with, byte for byte.

Run it where the reference encoder is (the GPU machine; the script finds it in the installed transformers package, or
takes --encoder PATH to an encoding_dsv32.py):

  python3 tests/data/tools/make_dsv32_encodings.py [--encoder PATH]

Tools are passed as vLLM's deepseek_v32 tokenizer mode passes them: a system message put first that holds them, and
drop_thinking off.
"""
import argparse
import glob
import hashlib
import importlib.util
import json
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "chat", "deepseek_v32")


def find_encoder(path):
    if path:
        return path
    try:
        import transformers
    except ImportError:
        sys.exit("no --encoder given and transformers is not installed")
    root = os.path.dirname(transformers.__file__)
    hits = glob.glob(os.path.join(root, "**", "encoding_dsv32.py"), recursive=True)
    if not hits:
        sys.exit(f"no encoding_dsv32.py under {root}: pass --encoder")
    return hits[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--encoder", help="path to DeepSeek's encoding_dsv32.py")
    args = ap.parse_args()
    path = find_encoder(args.encoder)
    spec = importlib.util.spec_from_file_location("encoding_dsv32", path)
    enc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(enc)
    conversations = json.load(open(os.path.join(DATA, "conversations.json"), encoding="utf-8"))["conversations"]
    out = {}
    for c in conversations:
        messages = [dict(m) for m in c["messages"]]
        drop_thinking = True
        if c.get("tools"):
            messages.insert(0, {"role": "system", "tools": c["tools"]})
            drop_thinking = False
        try:
            out[c["name"]] = enc.encode_messages(messages, thinking_mode="thinking" if c["thinking"] else "chat",
                                                 drop_thinking=drop_thinking, add_default_bos_token=True)
        except Exception as e:  # the reference refuses it: fathom must refuse it too
            out[c["name"]] = {"error": f"{type(e).__name__}: {e}"}
        print(c["name"], "error" if isinstance(out[c["name"]], dict) else len(out[c["name"]]))
    digest = hashlib.sha256(open(path, "rb").read()).hexdigest()
    meta = {"encoder": os.path.basename(path), "encoder_sha256": digest, "python": platform.python_version()}
    try:
        import transformers
        meta["transformers"] = transformers.__version__
    except ImportError:
        pass
    json.dump({"made_by": "tests/data/tools/make_dsv32_encodings.py", "meta": meta, "prompts": out},
              open(os.path.join(DATA, "expected.json"), "w", encoding="utf-8"), ensure_ascii=False, indent=1)
    print("wrote", os.path.join(DATA, "expected.json"), meta)


if __name__ == "__main__":
    main()
