#!/usr/bin/env python3
"""Records DeepSeek's reference encoding of tests/data/chat/deepseek_v4/conversations.json.

DeepSeek-V4 ships its prompt format as Python (encoding/encoding_dsv4.py in the checkpoint, `encode_messages`), not
as a Jinja template. This script runs that reference encoder over each conversation and writes expected.json beside
the conversations, which tests/tokenizer/deepseek_v4_encoding_test.cc compares fathom's encoder with, byte for byte.

Run it with a copy of the reference encoder kept outside the tree (the script finds one in an installed transformers
or vLLM package, or takes --encoder PATH to an encoding_dsv4.py):

  python3 tests/data/tools/make_dsv4_encodings.py [--encoder PATH]

Each conversation gives `thinking` (thinking_mode "thinking" or "chat") and may give `tools`, `reasoning_effort`
(absent: None) and `drop_thinking` (absent: true). Tools are passed as vLLM's deepseek_v4 tokenizer mode passes them:
put on the first message when it is a system or developer message, else on a system message put first.
"""
import argparse
import datetime
import glob
import hashlib
import importlib.util
import json
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "chat", "deepseek_v4")


def find_encoder(path):
    if path:
        return path
    for package in ("transformers", "vllm"):
        try:
            root = os.path.dirname(importlib.import_module(package).__file__)
        except ImportError:
            continue
        hits = glob.glob(os.path.join(root, "**", "encoding_dsv4.py"), recursive=True)
        if hits:
            return hits[0]
    sys.exit("no --encoder given and no installed package ships encoding_dsv4.py: pass --encoder")


def with_tools(messages, tools):
    if not tools:
        return messages
    if messages and messages[0].get("role") in ("system", "developer"):
        messages[0] = dict(messages[0], tools=tools)
    else:
        messages.insert(0, {"role": "system", "tools": tools})
    return messages


def main():
    # The reference's messages print sets (its valid tasks): a fixed hash seed keeps expected.json byte-reproducible.
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.execve(sys.executable, [sys.executable] + sys.argv, dict(os.environ, PYTHONHASHSEED="0"))
    ap = argparse.ArgumentParser()
    ap.add_argument("--encoder", help="path to DeepSeek's encoding_dsv4.py")
    args = ap.parse_args()
    path = find_encoder(args.encoder)
    spec = importlib.util.spec_from_file_location("encoding_dsv4", path)
    enc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(enc)
    conversations = json.load(open(os.path.join(DATA, "conversations.json"), encoding="utf-8"))["conversations"]
    out = {}
    for c in conversations:
        messages = with_tools([dict(m) for m in c["messages"]], c.get("tools"))
        try:
            out[c["name"]] = enc.encode_messages(messages, thinking_mode="thinking" if c["thinking"] else "chat",
                                                 drop_thinking=c.get("drop_thinking", True),
                                                 add_default_bos_token=True,
                                                 reasoning_effort=c.get("reasoning_effort") or None)
        except Exception as e:  # the reference refuses it: fathom must refuse it too
            out[c["name"]] = {"error": f"{type(e).__name__}: {e}"}
        print(c["name"], "error" if isinstance(out[c["name"]], dict) else len(out[c["name"]]))
    data = open(path, "rb").read()
    meta = {"encoder": os.path.basename(path), "encoder_sha256": hashlib.sha256(data).hexdigest(),
            "encoder_bytes": len(data), "python": platform.python_version(),
            "date": datetime.date.today().isoformat()}
    json.dump({"made_by": "tests/data/tools/make_dsv4_encodings.py", "meta": meta, "prompts": out},
              open(os.path.join(DATA, "expected.json"), "w", encoding="utf-8"), ensure_ascii=False, indent=1)
    print("wrote", os.path.join(DATA, "expected.json"), meta)


if __name__ == "__main__":
    main()
