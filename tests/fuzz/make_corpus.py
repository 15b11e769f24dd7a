#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/fuzz_targets.h) into tests/data/fuzz/<target>/.

    /usr/bin/python3 tests/fuzz/make_corpus.py          # from the repository root; standard library only
    /usr/bin/python3 tests/fuzz/make_corpus.py grammar http_framing   # only these targets' seeds

Seeds are small and valid (or nearly so), so that mutations reach deep: whole tiny checkpoints in the real tensor
layouts of Llama, Qwen2 and DeepSeek-V3, tokenizers cut down from the real ones in tests/data/tokenizers, the real
chat templates, and HTTP requests for every route. The json_routes seeds are kept as they are.
"""
import gzip
import json
import os
import random
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")
OUT = os.path.join(DATA, "fuzz")


def write(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# --- model_files: config.json, "#safetensors", a .safetensors file ---------------------------------------------------
def safetensors(tensors, rng):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, dtype, shape in tensors:
        n = 1
        for s in shape:
            n *= s
        size = n * {"BF16": 2, "F32": 4, "F16": 2, "F8_E4M3": 1}[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + size]}
        if dtype == "BF16":  # small values: bf16 is the top half of an f32
            blob = b"".join(struct.pack("<f", rng.uniform(-0.1, 0.1))[2:] for _ in range(n))
        else:
            blob = bytes(rng.randrange(256) for _ in range(size))
        blobs.append(blob)
        off += size
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def dense_tensors(c, bias):
    V, H, I, L = c["vocab_size"], c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    nh, kv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = H // nh
    t = [("model.embed_tokens.weight", "BF16", [V, H])]
    for i in range(L):
        p = f"model.layers.{i}."
        t += [(p + "input_layernorm.weight", "BF16", [H]), (p + "post_attention_layernorm.weight", "BF16", [H])]
        for proj, rows in (("q", nh * hd), ("k", kv * hd), ("v", kv * hd)):
            t.append((p + f"self_attn.{proj}_proj.weight", "BF16", [rows, H]))
            if bias:
                t.append((p + f"self_attn.{proj}_proj.bias", "BF16", [rows]))
        t.append((p + "self_attn.o_proj.weight", "BF16", [H, nh * hd]))
        t += [(p + "mlp.gate_proj.weight", "BF16", [I, H]), (p + "mlp.up_proj.weight", "BF16", [I, H]),
              (p + "mlp.down_proj.weight", "BF16", [H, I])]
    t.append(("model.norm.weight", "BF16", [H]))
    if not c.get("tie_word_embeddings"):
        t.append(("lm_head.weight", "BF16", [V, H]))
    return t


def deepseek_tensors(c):
    V, H, I, L = c["vocab_size"], c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    nh, qr, kvr = c["num_attention_heads"], c["q_lora_rank"], c["kv_lora_rank"]
    nope, rope, vd = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    E, mi, ns = c["n_routed_experts"], c["moe_intermediate_size"], c["n_shared_experts"]
    t = [("model.embed_tokens.weight", "BF16", [V, H])]
    for i in range(L):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        t += [(p + "input_layernorm.weight", "BF16", [H]), (p + "post_attention_layernorm.weight", "BF16", [H]),
              (a + "q_a_proj.weight", "BF16", [qr, H]), (a + "q_a_layernorm.weight", "BF16", [qr]),
              (a + "q_b_proj.weight", "BF16", [nh * (nope + rope), qr]),
              (a + "kv_a_proj_with_mqa.weight", "BF16", [kvr + rope, H]), (a + "kv_a_layernorm.weight", "BF16", [kvr]),
              (a + "kv_b_proj.weight", "BF16", [nh * (nope + vd), kvr]), (a + "o_proj.weight", "BF16", [H, nh * vd])]
        m = p + "mlp."
        if i < c["first_k_dense_replace"]:
            t += [(m + "gate_proj.weight", "BF16", [I, H]), (m + "up_proj.weight", "BF16", [I, H]),
                  (m + "down_proj.weight", "BF16", [H, I])]
            continue
        t += [(m + "gate.weight", "BF16", [E, H]), (m + "gate.e_score_correction_bias", "BF16", [E])]
        for e in range(E):
            x = m + f"experts.{e}."
            t += [(x + "gate_proj.weight", "BF16", [mi, H]), (x + "up_proj.weight", "BF16", [mi, H]),
                  (x + "down_proj.weight", "BF16", [H, mi])]
        s = m + "shared_experts."
        t += [(s + "gate_proj.weight", "BF16", [mi * ns, H]), (s + "up_proj.weight", "BF16", [mi * ns, H]),
              (s + "down_proj.weight", "BF16", [H, mi * ns])]
    t += [("model.norm.weight", "BF16", [H]), ("lm_head.weight", "BF16", [V, H])]
    return t


def model_files():
    rng = random.Random(7)
    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32, "hidden_size": 16,
             "intermediate_size": 24, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
             "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "bos_token_id": 0,
             "eos_token_id": 1, "torch_dtype": "bfloat16"}
    qwen = dict(llama, architectures=["Qwen2ForCausalLM"], model_type="qwen2", tie_word_embeddings=True,
                rope_theta=1000000.0)
    ds_src = json.load(open(os.path.join(DATA, "models", "deepseek-v3-tiny", "config.json")))
    ds = dict(ds_src, vocab_size=32, hidden_size=16, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=2, max_position_embeddings=256, q_lora_rank=8, kv_lora_rank=8, qk_nope_head_dim=4,
              qk_rope_head_dim=4, v_head_dim=4, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
              moe_intermediate_size=8, n_group=2, topk_group=1)
    ds["rope_scaling"] = dict(ds_src["rope_scaling"], factor=4, original_max_position_embeddings=64)
    seeds = {"llama_full": (llama, dense_tensors(llama, False)), "qwen2_tied_full": (qwen, dense_tensors(qwen, True)),
             "deepseek_v3_full": (ds, deepseek_tensors(ds))}
    for name, (cfg, tensors) in seeds.items():
        write("model_files", name, json.dumps(cfg, indent=1).encode() + b"\n#safetensors\n" +
              safetensors(tensors, rng))
    # A wrong shape, and a missing tensor: the loader's errors.
    bad = dense_tensors(llama, False)
    bad[1] = (bad[1][0], "BF16", [17])
    write("model_files", "llama_bad_shape", json.dumps(llama).encode() + b"\n#safetensors\n" + safetensors(bad, rng))
    write("model_files", "llama_missing", json.dumps(llama).encode() + b"\n#safetensors\n" +
          safetensors(dense_tensors(llama, False)[:-3], rng))
    # The real configs (with quantization_config where they have one), without tensors.
    for f in sorted(os.listdir(os.path.join(DATA, "configs"))):
        with open(os.path.join(DATA, "configs", f), "rb") as src:
            write("model_files", "config_" + f.replace(".json", ""), src.read() + b"\n#safetensors\n")


# --- tokenizer: tokenizer.json, "#config", tokenizer_config.json, "#text", text --------------------------------------
def small_tokenizer(name, keep_merges, keep_added=()):
    with gzip.open(os.path.join(DATA, "tokenizers", name, "tokenizer.json.gz"), "rt", encoding="utf-8") as f:
        tj = json.load(f)
    model = tj["model"]
    vocab = model["vocab"]
    merges = model.get("merges", [])
    keep = {t for t in vocab if len(t) == 1}
    kept_merges = []
    for m in merges:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        if a in keep and b in keep and len(kept_merges) < keep_merges:
            kept_merges.append(m)
            keep.add(a + b)
    tokens = sorted(keep, key=lambda t: vocab[t])
    model["vocab"] = {t: i for i, t in enumerate(tokens)}
    model["merges"] = kept_merges
    n = len(tokens)
    added = [at for i, at in enumerate(tj.get("added_tokens", [])) if i < 12 or at["content"] in keep_added]
    for i, at in enumerate(added):
        at["id"] = n + i
    tj["added_tokens"] = added
    # Post-processors name special tokens by id: point them at the added tokens kept.
    pp = json.dumps(tj.get("post_processor"))
    ids = {at["content"]: at["id"] for at in tj["added_tokens"]}
    pp_obj = json.loads(pp)
    if isinstance(pp_obj, dict):
        def fix(o):
            if isinstance(o, dict):
                if "special_tokens" in o and isinstance(o["special_tokens"], dict):
                    o["special_tokens"] = {k: dict(v, ids=[ids.get(k, 0)]) for k, v in o["special_tokens"].items()
                                           if k in ids}
                for v in o.values():
                    fix(v)
            elif isinstance(o, list):
                for v in o:
                    fix(v)
        fix(pp_obj)
        tj["post_processor"] = pp_obj
    return tj


def tokenizers():
    for name in ("deepseek-v3", "qwen3", "llama-3.1"):
        tj = small_tokenizer(name, 300)
        with open(os.path.join(DATA, "tokenizers", name, "tokenizer_config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        cfg.pop("chat_template", None)
        body = json.dumps(tj, ensure_ascii=False, separators=(",", ":"))
        write("tokenizer", name, body)
        write("tokenizer", name + "_config_text", body + "\n#config\n" + json.dumps(cfg, ensure_ascii=False) +
              "\n#text\nThe quick brown fox 🦊 jumps; <think>42</think>\n\n  x = [1, 2]")
    # A Metaspace (SentencePiece-style) tokenizer, as Llama 2 and DeepSeek-LLM use.
    pieces = ["<unk>", "<s>", "</s>", "▁"] + [chr(c) for c in range(97, 123)] + ["▁t", "he", "▁the", "▁a"]
    sp = {"version": "1.0", "added_tokens": [{"id": i, "content": t, "special": True, "single_word": False,
                                              "lstrip": False, "rstrip": False, "normalized": False}
                                             for i, t in enumerate(pieces[:3])],
          "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                              {"type": "Replace", "pattern": {"String": " "},
                                                               "content": "▁"}]},
          "pre_tokenizer": None,
          "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                                                       {"type": "ByteFallback"}, {"type": "Fuse"},
                                                       {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
          "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                    "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": False,
                    "vocab": {t: i for i, t in enumerate(pieces)}, "merges": ["▁ t", "h e", "▁t he", "▁ a"]}}
    write("tokenizer", "sentencepiece_bpe", json.dumps(sp, ensure_ascii=False))
    meta = dict(sp, normalizer=None, pre_tokenizer={"type": "Metaspace", "replacement": "▁",
                                                    "prepend_scheme": "first", "split": True},
                decoder={"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True})
    write("tokenizer", "metaspace", json.dumps(meta, ensure_ascii=False) + "\n#text\nthe a the\n")


# --- chat_template: a template source -------------------------------------------------------------------------------
def chat_templates():
    for name in ("deepseek-v3", "qwen3", "llama-3.1"):
        with open(os.path.join(DATA, "tokenizers", name, "tokenizer_config.json"), encoding="utf-8") as f:
            t = json.load(f)["chat_template"]
        if isinstance(t, list):
            for item in t:
                write("chat_template", f"{name}_{item['name']}", item["template"])
        else:
            write("chat_template", name, t)
    small = {
        "loops": "{% for m in messages %}{{ loop.index }}:{{ m.role|upper }} {{ m.content|default('')|trim }}"
                 "{% if not loop.last %}\n{% endif %}{% endfor %}",
        "macro_namespace": "{% macro f(x, n=2) %}{{ x * n }}{% endmacro %}{% set ns = namespace(k=0) %}"
                           "{% for i in range(5) %}{% set ns.k = ns.k + i %}{% endfor %}{{ f(ns.k) }}{{ f('ab', 3) }}",
        "filters": "{{ tools|tojson(indent=2) }}{{ messages|map(attribute='role')|join(',') }}"
                   "{{ 'a,b'.split(',')|list|length }}{{ messages[1:3]|selectattr('content')|list|count }}",
        "exprs": "{{ (1 + 2 * 3) // 2 ** 2 % 5 }}{{ -7 // 2 }}{{ 'x' ~ 1 ~ none }}{{ [1, [2, 3]][1][0] }}"
                 "{{ {'a': 1}.items()|list }}{% if 'b' in 'abc' and not false %}y{% endif %}",
        "raise": "{% if messages|length > 100 %}{{ raise_exception('too many') }}{% endif %}{{ bos_token }}",
    }
    for name, src in small.items():
        write("chat_template", name, src)


# --- http: raw requests ----------------------------------------------------------------------------------------------
def http_tokenizer():
    """DeepSeek-V3's tokenizer cut down to ~600 ids (every special token its chat template names kept), with its real
    tokenizer_config.json and chat template: the http target's, so that sampling is cheap."""
    import re
    with open(os.path.join(DATA, "tokenizers", "deepseek-v3", "tokenizer_config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    named = set(re.findall(r"<｜[^>]*｜>", cfg["chat_template"])) | {"<think>", "</think>"}
    tj = small_tokenizer("deepseek-v3", 300, named)
    d = os.path.join(DATA, "fuzz", "http-tokenizer")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False, separators=(",", ":"))
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)


def http_requests():
    auth = "Authorization: Bearer fuzz-key\r\n"

    def req(method, target, body=None, headers="", close=False):
        h = f"{method} {target} HTTP/1.1\r\nHost: fuzz\r\n{auth}{headers}"
        if body is not None:
            h += f"Content-Type: application/json\r\nContent-Length: {len(body.encode())}\r\n"
        if close:
            h += "Connection: close\r\n"
        return h + "\r\n" + (body or "")

    chat = json.dumps({"model": "fathom", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    seeds = {
        "health": "GET /health HTTP/1.1\r\nHost: fuzz\r\n\r\n",
        "models": req("GET", "/v1/models"),
        "model_one": req("GET", "/v1/models/fathom"),
        "metrics": req("GET", "/metrics"),
        "chat": req("POST", "/v1/chat/completions", chat),
        "chat_stream_usage": req("POST", "/v1/chat/completions", json.dumps(
            {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hello"}], "stream": True,
             "stream_options": {"include_usage": True}, "temperature": 0.7, "top_p": 0.9, "seed": 3, "n": 2})),
        "chat_logprobs": req("POST", "/v1/chat/completions", json.dumps(
            {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 3, "stop": ["\n"],
             "max_completion_tokens": 5, "presence_penalty": 0.5, "logit_bias": {"100": 5}})),
        "completion": req("POST", "/v1/completions", json.dumps({"prompt": "def f(", "max_tokens": 6, "echo": False})),
        "completion_ids_stream": req("POST", "/v1/completions", json.dumps(
            {"prompt": [0, 100, 200, 300], "stream": True, "logprobs": 2, "min_tokens": 2})),
        "tokenize": req("POST", "/tokenize", json.dumps({"prompt": "Hello 🦊", "add_special_tokens": False})),
        "tokenize_chat": req("POST", "/tokenize", json.dumps({"messages": [{"role": "user", "content": "hi"}]})),
        "detokenize": req("POST", "/detokenize", json.dumps({"tokens": [0, 100, 560, 9999]})),
        "resumable_then_resume": req("POST", "/v1/chat/completions", json.dumps(
            {"messages": [{"role": "user", "content": "go"}], "stream": True,
             "stream_options": {"resumable": True}})) + req("GET", "/v1/streams/LAST", headers="Last-Event-ID: 1\r\n"),
        "resume_header_optin": req("POST", "/v1/completions", json.dumps({"prompt": "a", "stream": True}),
                                   headers="X-Fathom-Resumable: 1\r\n") + req("GET", "/v1/streams/LAST"),
        "pipelined": req("GET", "/health") + req("POST", "/v1/completions", json.dumps({"prompt": "q"})) +
                     req("GET", "/v1/models", close=True),
        "chunked": (f"POST /v1/completions HTTP/1.1\r\nHost: fuzz\r\n{auth}Transfer-Encoding: chunked\r\n\r\n"
                    "7\r\n{\"promp\r\n9\r\nt\": \"hi\"}\r\n0\r\n\r\n"),
        "no_auth": "POST /v1/chat/completions HTTP/1.1\r\nHost: fuzz\r\nContent-Length: 2\r\n\r\n{}",
        "lower_bearer": req("GET", "/v1/models").replace("Bearer", "bearer"),
        "bad_path": "GET /\xff\xfe?x=\xc3\x28 HTTP/1.1\r\nHost: fuzz\r\n\r\n",
        "bad_stream": req("GET", "/v1/streams/\xc3\x28", headers="Last-Event-ID: -1\r\n"),
        "wrong_method": req("DELETE", "/v1/chat/completions"),
        "head": req("HEAD", "/health"),
        "bad_json": req("POST", "/v1/chat/completions", '{"messages": [{"role": "user", "content": "x"}'),
        "wrong_types": req("POST", "/tokenize", json.dumps({"prompt": "hi", "add_special_tokens": "x"})),
        "too_long": req("POST", "/v1/completions", json.dumps({"prompt": "word " * 200, "max_tokens": 1})),
        "trace": req("POST", "/debug/trace"),
    }
    for name, data in seeds.items():
        # Raw bytes that are not UTF-8 (in the paths of bad_path and bad_stream) are written as they are.
        write("http", name, data.encode("latin-1") if name.startswith("bad_") else data.encode())


def json_routes():
    extra = {"tokenize": {"prompt": "hi", "add_special_tokens": True},
             "tokenize_chat": {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True},
             "detokenize": {"tokens": [1, 2, 3]}}
    for name, body in extra.items():
        write("json_routes", name + ".json", json.dumps(body))


# --- grammar: a front-end byte ('0' JSON Schema, '1' regex, '2' GBNF), then its text --------------------------------
def grammar():
    schemas = {
        "object": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                                    "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                                    "tags": {"type": "array", "items": {"type": "string"},
                                                             "maxItems": 3}},
                   "required": ["name"], "additionalProperties": False},
        "enum_const": {"anyOf": [{"enum": ["red", "green", 3, None, True]}, {"const": {"k": [1, 2]}}]},
        "recursive": {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "number"},
                                                                          "kids": {"type": "array",
                                                                                   "items": {"$ref": "#/$defs/node"}}},
                                         "required": ["v"]}}, "$ref": "#/$defs/node"},
        "formats": {"type": "object", "properties": {"when": {"type": "string", "format": "date-time"},
                                                     "id": {"type": "string", "format": "uuid"},
                                                     "ip": {"type": "string", "format": "ipv4"},
                                                     "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"}}},
        "arrays": {"type": "array", "prefixItems": [{"type": "boolean"}, {"type": ["string", "null"]}],
                   "items": {"type": "number", "exclusiveMinimum": -1.5}, "minItems": 2, "uniqueItems": True},
        "allof_extra": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                                  {"properties": {"b": {"type": "string", "minLength": 2}}, "required": ["b"]}],
                        "additionalProperties": {"type": "integer"}, "minProperties": 1},
        "pattern_props": {"type": "object", "properties": {"x": {}}, "patternProperties": {"^y[0-9]+$": {}},
                          "additionalProperties": False},
        "any": {},
    }
    for name, schema in schemas.items():
        write("grammar", "schema_" + name, "0" + json.dumps(schema))
    write("grammar", "schema_draft4", "0" + json.dumps({"type": "array", "items": [{"type": "integer"}],
                                                        "additionalItems": False,
                                                        "definitions": {"n": {"type": "integer", "maximum": 9,
                                                                              "exclusiveMaximum": True}}}))
    write("grammar", "schema_refused", "0" + json.dumps({"type": "string", "not": {"const": "x"}}))
    regexes = {
        "phone": r"\(\d{3}\) \d{3}-\d{4}",
        "alternation": r"^(?:yes|no|maybe)$|[0-9]+(\.[0-9]{1,2})?",
        "classes": r"[A-Za-z_][\w-]{0,15}@[^\s@]+\.[a-z]{2,6}",
        "unicode": r"[\u00e9\u4e2d-\u4e2f]+\u{1F98A}?.\x41",
        "groups": r"(?<year>\d{4})-(0[1-9]|1[0-2])-(?:[0-2]\d|3[01])",
        "lazy_counted": r"a{2,}?b*?(c|d){0,3}e+?",
        "refused": r"(a)\1|(?=x)",
    }
    for name, rx in regexes.items():
        write("grammar", "regex_" + name, "1" + rx)
    gbnfs = {
        "arith": 'root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= factor (("*" | "/") factor)*\n'
                 'factor ::= [0-9]+ | "(" expr ")"\n',
        "json": 'root ::= value\nvalue ::= object | array | string | number | ("true" | "false" | "null")\n'
                'object ::= "{" ( string ":" value ("," string ":" value)* )? "}"\n'
                'array ::= "[" ( value ("," value)* )? "]"\n'
                'string ::= "\\"" ( [^"\\\\\\x7F\\x00-\\x1F] | "\\\\" ["\\\\/bfnrt] )* "\\""\n'
                'number ::= "-"? [0-9]+ ("." [0-9]+)? ([eE] [-+]? [0-9]+)?\n',
        "list": '# a comment\nroot ::= item ("," item){0,4}\nitem ::= "\\u00e9" | [a-c]{2} | . | "x"?\n',
        "nested": 'root ::= "(" inner ")" | "x"\ninner ::= root (" " root)*\n',
        "left_recursive": 'root ::= root "a" | "b"\n',
        "undefined": 'root ::= missing\n',
    }
    for name, g in gbnfs.items():
        write("grammar", "gbnf_" + name, "2" + g)


# --- http_framing: a byte stream of pipelined requests ----------------------------------------------------------------
def http_framing():
    get = "GET /v1/models?x=1 HTTP/1.1\r\nHost: a\r\n\r\n"
    body = '{"prompt":"hi"}'
    post = f"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    chunked = ("POST /tokenize HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
               "7\r\n{\"promp\r\n8;ext=1;q=\"a b\"\r\nt\":\"hi\"}\r\n0\r\n\r\n")
    seeds = {
        "get": get,
        "post": post,
        "chunked": chunked,
        "chunked_trailers": ("POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n"
                             "000A\r\n0123456789\r\n0;last\r\nX-Checksum: 1\r\nX-Other: 2\r\n\r\n"),
        "pipelined": get + post + chunked + "GET /health HTTP/1.1\r\nConnection: close\r\n\r\n" + get,
        "http10": "POST /x HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc" + get,
        "http10_keepalive": "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" + get,
        "zero_length": "POST /x HTTP/1.1\r\nContent-Length: 0\r\n\r\n" + post,
        "ows_values": "POST /x HTTP/1.1\r\nContent-Length:\t 2 \t\r\nX: \x80\xff\r\n\r\nok" + get,
        # Refused by fathom (and a strict proxy), each a classic smuggling shape.
        "te_and_cl": "POST / HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + get,
        "te_gzip_chunked": "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n" + get,
        "te_twice": "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "te_obs_fold": "POST / HTTP/1.1\r\nTransfer-Encoding:\r\n chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n" + get,
        "te_xchunked": "POST / HTTP/1.1\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n" + get,
        "cl_list": "POST / HTTP/1.1\r\nContent-Length: 3, 3\r\n\r\nabc" + get,
        "cl_twice": "POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc" + get,
        "cl_sign": "POST / HTTP/1.1\r\nContent-Length: +3\r\n\r\nabc" + get,
        "space_before_colon": "POST / HTTP/1.1\r\nContent-Length : 3\r\n\r\nabc" + get,
        "bare_lf": "GET / HTTP/1.1\nHost: a\n\n" + get,
        "chunk_size_ws": "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3 \r\nabc\r\n0\r\n\r\n" + get,
        "chunk_bad_crlf": "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n0\r\n\r\n" + get,
        "trailer_cl": "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nContent-Length: 5\r\n\r\n" + get,
        "truncated_body": "POST / HTTP/1.1\r\nContent-Length: 99\r\n\r\nabc",
        "leading_crlf": "\r\n" + get,
    }
    for name, data in seeds.items():
        write("http_framing", name, data.encode("latin-1"))


# --- tool_calls: a format byte (0 none, 1 deepseek_v3, 2 deepseek_v31, 3 deepseek_v32, 4 hermes, 5 llama3_json,
# 6 deepseek_v4), a piece-size byte, then a model's output ---------------------------------------------------------
def tool_calls():
    v3 = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
          '{"city": "Paris"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n'
          "```<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    v31 = ('Ok<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>search<｜tool▁sep｜>{"q":"x"}<｜tool▁call▁end｜>'
           "<｜tool▁call▁begin｜>open<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜> after")
    dsml = ('Let me check.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
            '<｜DSML｜parameter name="city" string="true">São "Paulo"</｜DSML｜parameter>\n'
            '<｜DSML｜parameter name="days" string="false">[1, {"a": 2}]</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
            '<｜DSML｜invoke name="t">\n\n</｜DSML｜invoke>\n</｜DSML｜function_calls>')
    hermes = ('I will look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
              '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>')
    llama = '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}'
    seeds = {"none_text": (0, 1, "plain text <｜tool▁calls▁begin｜> stays"), "v3_two": (1, 3, v3),
             "v3_cut": (1, 1, v3[:70]), "v31_two": (2, 5, v31), "dsml_two": (3, 2, dsml), "dsml_cut": (3, 7, dsml[:150]),
             "dsml_bad_param": (3, 4, '\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter '
                                      'name="k" string="false">not json</｜DSML｜parameter>\nstray</｜DSML｜invoke>'),
             "hermes_two": (4, 6, hermes), "llama3": (5, 9, llama),
             "dsml_v4_two": (6, 3, dsml.replace("function_calls", "tool_calls")),
             "dsml_v4_cut": (6, 5, dsml.replace("function_calls", "tool_calls")[:140])}
    for name, (fmt, piece, text) in seeds.items():
        write("tool_calls", name, bytes([fmt, piece]) + text.encode())


if __name__ == "__main__":
    generators = {"model_files": [model_files], "tokenizer": [tokenizers], "chat_template": [chat_templates],
                  "http": [http_tokenizer, http_requests], "json_routes": [json_routes], "grammar": [grammar],
                  "http_framing": [http_framing], "tool_calls": [tool_calls]}
    for target in sys.argv[1:] or generators:
        for generate in generators[target]:
            generate()
