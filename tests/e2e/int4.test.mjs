// `fathom serve --model <an AWQ or GPTQ folder>` serves: each INT4 fixture (tests/data/quant) is unpacked, given a
// byte-level tokenizer of its 512-token vocabulary, and served next to its float32 twin; greedy completions from the
// two are the same tokens, through the official openai client.
import {test} from 'node:test';
import assert from 'node:assert/strict';
import {execFileSync} from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import {dataDir, startServer, tmpDir} from './lib/fathom.mjs';

// GPT-2's byte-to-unicode table: the 256 byte tokens of a byte-level BPE vocabulary.
function byteTokens() {
  const bs = [];
  for (let b = 33; b <= 126; ++b) bs.push(b);
  for (let b = 161; b <= 172; ++b) bs.push(b);
  for (let b = 174; b <= 255; ++b) bs.push(b);
  const cs = [...bs];
  let n = 0;
  for (let b = 0; b < 256; ++b) {
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n++);
    }
  }
  const vocab = {};
  bs.forEach((b, i) => { vocab[String.fromCodePoint(cs[i])] = b; });  // token id = the byte
  return vocab;
}

// A byte-level BPE tokenizer.json of the fixtures' 512 ids: 0..255 the bytes, 256 + 16i + j the merge of the letters
// 'a' + i and 'a' + j, so that every id the model writes has a text of its own.
function writeByteTokenizer(dir) {
  const vocab = byteTokens(), merges = [];
  for (let i = 0; i < 16; ++i) {
    for (let j = 0; j < 16; ++j) {
      const a = String.fromCharCode(97 + i), b = String.fromCharCode(97 + j);
      vocab[a + b] = 256 + 16 * i + j;
      merges.push(`${a} ${b}`);
    }
  }
  const tok = {
    version: '1.0',
    added_tokens: [],
    normalizer: null,
    pre_tokenizer: {type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true},
    post_processor: null,
    decoder: {type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true},
    model: {type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
            fuse_unk: false, byte_fallback: false, vocab, merges},
  };
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tok));
}

const fixtures = ['llama3-distill-tiny-awq', 'qwen2-distill-tiny-gptq-actorder', 'deepseek-v2-lite-tiny-awq'];

for (const name of fixtures) {
  test(`serves the ${name} INT4 checkpoint with its float32 twin's greedy tokens`, async () => {
    const dir = tmpDir('fathom-int4-');
    execFileSync('tar', ['-xJf', path.join(dataDir, 'quant', `${name}.tar.xz`), '-C', dir]);
    const quant = path.join(dir, name, 'quant'), twin = path.join(dir, name, 'twin');
    writeByteTokenizer(quant);
    writeByteTokenizer(twin);
    const texts = {};
    for (const [which, model] of [['quant', quant], ['twin', twin]]) {
      const srv = await startServer(['--model', model, '--served-model-name', 'm', '--max-model-len', '256']);
      try {
        const client = new OpenAI({baseURL: srv.url + '/v1', apiKey: 'x'});
        const r = await client.completions.create({model: 'm', prompt: [3, 14, 15, 92, 65, 35], max_tokens: 12,
                                                   temperature: 0, ignore_eos: true, logprobs: 1});
        assert.equal(r.usage.prompt_tokens, 6);
        assert.equal(r.usage.completion_tokens, 12);
        texts[which] = r.choices[0].logprobs.tokens;
        assert.ok(texts[which].every((piece) => piece.length > 0), JSON.stringify(texts[which]));
        // Text in, text out through the tokenizer too.
        const t = await client.completions.create({model: 'm', prompt: 'xyz', max_tokens: 4, temperature: 0,
                                                   ignore_eos: true});
        assert.equal(t.usage.prompt_tokens, 3);  // three bytes, no merge
        assert.equal(t.usage.completion_tokens, 4);
      } finally {
        assert.equal(await srv.stop(), 0);
      }
    }
    assert.deepEqual(texts.quant, texts.twin);
    fs.rmSync(dir, {recursive: true, force: true});
  });
}
