#!/usr/bin/env python3
"""Renders tests/data/chat/deepseek_v31/conversations.json with DeepSeek-V3.1's chat template through Hugging Face
transformers' apply_chat_template (the oracle), over the DeepSeek-V3 tokenizer of tests/data/tokenizers (whose
special tokens the template names), and writes expected.json beside them.

  python3 tests/data/tools/make_dsv31_renders.py            # on a machine with transformers
"""
import gzip
import hashlib
import json
import os
import shutil
import sys
import tempfile

import transformers

here = os.path.dirname(os.path.abspath(__file__))
data = os.path.join(here, "..", "chat", "deepseek_v31")
template = open(os.path.join(data, "chat_template.jinja"), encoding="utf-8").read()
src = os.path.join(here, "..", "tokenizers", "deepseek-v3")
tmp = tempfile.mkdtemp()
shutil.copy(os.path.join(src, "tokenizer_config.json"), tmp)
with gzip.open(os.path.join(src, "tokenizer.json.gz"), "rb") as f, open(os.path.join(tmp, "tokenizer.json"), "wb") as g:
    g.write(f.read())
tok = transformers.AutoTokenizer.from_pretrained(tmp)
convs = json.load(open(os.path.join(data, "conversations.json"), encoding="utf-8"))["conversations"]
prompts = {}
for c in convs:
    prompts[c["name"]] = tok.apply_chat_template(c["messages"], chat_template=template, tokenize=False,
                                                 add_generation_prompt=c["add_generation_prompt"],
                                                 thinking=c["thinking"])
meta = {"transformers": transformers.__version__, "python": sys.version.split()[0],
        "template_sha256": hashlib.sha256(template.encode("utf-8")).hexdigest()}
with open(os.path.join(data, "expected.json"), "w", encoding="utf-8") as f:
    json.dump({"meta": meta, "prompts": prompts}, f, ensure_ascii=False, indent=1)
    f.write("\n")
print(f"{len(prompts)} prompts, transformers {transformers.__version__}")
