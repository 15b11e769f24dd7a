// DeepSeek's DSML tool calls (V3.2's and V4's built-in prompt formats) through the official openai client, each on a
// checkpoint of its own as published (a tokenizer without a chat template, dummy weights), and V4 on its oracle
// fixture: a suite apart from tools.test.mjs so that ctest runs the two side by side.
import {test} from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import {dataDir, startServer, tmpDir, writeTokenizer} from './lib/fathom.mjs';
import {checkCall, collect, messages, tools} from './lib/tool_calls.mjs';

// A DeepSeek-V3.2 checkpoint as published: model_type deepseek_v32 and a tokenizer without a chat template, so the
// server picks the built-in V3.2 encoding by itself. The real config cut to two small layers (index_topk 8, so that
// prompts run the sparse attention) with dummy weights, and DeepSeek-V3's tokenizer (V3.2's vocabulary).
function v32Folder() {
  const dir = tmpDir('fathom-v32-serve-');
  writeTokenizer(dir);
  const tc = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8'));
  delete tc.chat_template;
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(tc));
  const cfg = JSON.parse(fs.readFileSync(path.join(dataDir, 'configs/deepseek-v3.2.json'), 'utf8'));
  delete cfg.quantization_config;
  delete cfg.rope_scaling;
  Object.assign(cfg, {hidden_size: 64, intermediate_size: 128, moe_intermediate_size: 32, n_routed_experts: 4,
                      n_shared_experts: 1, num_experts_per_tok: 2, n_group: 1, topk_group: 1, num_hidden_layers: 2,
                      first_k_dense_replace: 1, num_attention_heads: 4, num_key_value_heads: 4, q_lora_rank: 32,
                      kv_lora_rank: 32, qk_nope_head_dim: 16, qk_rope_head_dim: 8, v_head_dim: 16,
                      index_n_heads: 4, index_head_dim: 32, index_topk: 8, max_position_embeddings: 4096,
                      num_nextn_predict_layers: 0});
  fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify(cfg));
  return dir;
}

// DeepSeek's DSML (V3.2's <｜DSML｜function_calls> block, V4's <｜DSML｜tool_calls>), through the same client, on a
// checkpoint in `dir`. A forced call is a grammar of DSML parameter lines; a call the model writes (a regex plays the
// model) is parsed as it streams; the round trip: the call and its result go back in the history, encoded as the
// version encodes them (the prompt then ends in `resultsEnd`), and the model answers. `thinking` decides per request
// whether the answer is reasoning. (Named calls and the non-streamed parse of the format are the unit tests'
// (tests/server/tools_test.cc), and the API paths of both are tools.test.mjs's, on DeepSeek-V3's format.)
async function dsmlCheckpointCase(dir, block, resultsEnd, {dummy = true} = {}) {
  const model = dummy ? ['--model', path.join(dir, 'config.json'), '--load-format', 'dummy', '--tokenizer', dir]
                      : ['--model', dir, '--max-model-len', '4096'];
  const local = await startServer([...model, '--served-model-name', 'deepseek-chat', '--access-log', 'off']);
  try {
    const c = new OpenAI({baseURL: local.url + '/v1', apiKey: 'x', maxRetries: 0});
    const forced = await c.chat.completions.create({model: 'deepseek-chat', messages, tools, tool_choice: 'required',
                                                    parallel_tool_calls: false, max_tokens: 400, seed: 1});
    const m = forced.choices[0].message;
    assert.equal(forced.choices[0].finish_reason, 'tool_calls');
    assert.equal(m.content, null);
    assert.equal(m.tool_calls.length, 1);
    checkCall(m.tool_calls[0]);
    // max_tokens covers the texts byte by byte (the random model may spell them so).
    const dsmlCall = `\n\n<｜DSML｜${block}>\n<｜DSML｜invoke name="get_weather">\n` +
                     '<｜DSML｜parameter name="city" string="true">(Paris|Rome)</｜DSML｜parameter>\n' +
                     '<｜DSML｜parameter name="unit" string="true">c</｜DSML｜parameter>\n</｜DSML｜invoke>\n' +
                     `</｜DSML｜${block}>`;
    const streamed = await collect(await c.chat.completions.create({model: 'deepseek-chat', messages, tools,
                                                                    max_tokens: 512, stream: true,
                                                                    guided_regex: 'Checking\\.' + dsmlCall}));
    assert.equal(streamed.finish, 'tool_calls');
    assert.equal(streamed.content, 'Checking.');  // the blank line before the block is the format's
    assert.equal(streamed.calls.length, 1);
    assert.equal(streamed.calls[0].function.name, 'get_weather');
    assert.match(streamed.calls[0].function.arguments, /^\{"city": "(Paris|Rome)", "unit": "c"\}$/);

    const call = m.tool_calls[0];
    const history = [...messages, m, {role: 'tool', tool_call_id: call.id, content: '21 degrees'}];
    const answer = await c.chat.completions.create({model: 'deepseek-chat', messages: history, tools, max_tokens: 40,
                                                    guided_regex: 'It is 21 degrees\\.'});
    assert.equal(answer.choices[0].message.content, 'It is 21 degrees.');
    assert.equal(answer.choices[0].finish_reason, 'stop');
    // The prompt that answer came from: the call in DSML, its result, then the model's turn.
    const tok = await (await fetch(local.url + '/tokenize', {method: 'POST',
      body: JSON.stringify({model: 'deepseek-chat', messages: history, tools})})).json();
    const text = (await (await fetch(local.url + '/detokenize', {method: 'POST',
                                                                body: JSON.stringify({tokens: tok.tokens})})).json()).prompt;
    const args = JSON.parse(call.function.arguments);
    const params = Object.entries(args).map(([k, v]) =>
      `<｜DSML｜parameter name="${k}" string="true">${v}</｜DSML｜parameter>`).join('\n');
    assert.ok(text.includes(`<｜Assistant｜></think>\n\n<｜DSML｜${block}>\n<｜DSML｜invoke name="${call.function.name}">` +
                            `\n${params}\n</｜DSML｜invoke>\n</｜DSML｜${block}><｜end▁of▁sentence｜>`), text);
    assert.ok(text.endsWith(resultsEnd), text);
    // thinking: the prompt ends in <think> and the output is reasoning; without it, content.
    // (End of sentence, id 1 in DeepSeek's vocabularies, banned: a first token that ends the answer would leave both
    // fields empty.)
    const ask = (type) => c.chat.completions.create({model: 'deepseek-chat', messages, max_tokens: 6, seed: 3,
                                                     thinking: {type}, logit_bias: {1: -100}});
    const on = (await ask('enabled')).choices[0].message, off = (await ask('disabled')).choices[0].message;
    assert.ok(on.reasoning_content && !on.content, JSON.stringify(on));
    assert.ok(off.content && off.reasoning_content == null, JSON.stringify(off));
  } finally {
    await local.stop();
  }
}

test('DeepSeek-V3.2 checkpoint: DSML calls forced and written, a round trip, and thinking', async () => {
  await dsmlCheckpointCase(v32Folder(), 'function_calls',
                           '\n\n<function_results>\n<result>21 degrees</result>\n</function_results>\n\n</think>');
});

// A DeepSeek-V4 checkpoint as published: model_type deepseek_v4 (hub names, mHC, sliding / compressed sparse /
// heavily compressed layers, hash-routed MoE) and a tokenizer without a chat template, so the server picks the built-in
// V4 encoding by itself. The real V4-Flash config cut to three small layers (window 8, CSA top-2) with dummy weights,
// and DeepSeek-V3's tokenizer (V4's vocabulary).
function v4Folder() {
  const dir = tmpDir('fathom-v4-serve-');
  writeTokenizer(dir);
  const tc = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8'));
  delete tc.chat_template;
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(tc));
  const cfg = JSON.parse(fs.readFileSync(path.join(dataDir, 'configs/deepseek-v4-flash.json'), 'utf8'));
  delete cfg.quantization_config;
  delete cfg.expert_dtype;
  Object.assign(cfg, {hidden_size: 64, moe_intermediate_size: 32, n_routed_experts: 4, num_experts_per_tok: 2,
                      num_hidden_layers: 3, num_hash_layers: 1, compress_ratios: [0, 4, 128, 0], num_attention_heads: 4,
                      head_dim: 32, qk_rope_head_dim: 8, q_lora_rank: 32, o_groups: 2, o_lora_rank: 16,
                      index_n_heads: 4, index_head_dim: 16, index_topk: 2, sliding_window: 8, hc_mult: 2,
                      hc_sinkhorn_iters: 3, max_position_embeddings: 4096});
  fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify(cfg));
  return dir;
}

// V4's DSML on its checkpoint: the block is <｜DSML｜tool_calls>, and a tool's result is a user turn of its own.
test('DeepSeek-V4 checkpoint: DSML calls forced and written, a round trip, and thinking', async () => {
  await dsmlCheckpointCase(v4Folder(), 'tool_calls', '<｜User｜><tool_result>21 degrees</tool_result><｜Assistant｜></think>');
});

// The oracle fixture deepseek-v4-tiny itself (tests/data/models: transformers' weights, checked against its logits by
// model_deepseek_v4_test), served as a V4 folder: its 512-token vocabulary has no tokenizer, so the folder gets a
// byte-level one written here (a token a byte, ids 2-257; DeepSeek's begin and end of sentence at 0 and 1, as the
// config's bos_token_id and eos_token_id say; <｜User｜> and <｜Assistant｜> as added tokens), and no chat template, so the
// server picks V4's encoding by itself.
function v4FixtureFolder() {
  const dir = tmpDir('fathom-v4-fixture-');
  const src = path.join(dataDir, 'models/deepseek-v4-tiny');
  for (const f of ['config.json', 'model.safetensors']) fs.copyFileSync(path.join(src, f), path.join(dir, f));
  // GPT-2's byte-to-character map (ByteLevel): printable bytes stand for themselves, the others from U+0100 on.
  const vocab = {};
  let shifted = 0;
  for (let b = 0; b < 256; ++b) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    vocab[String.fromCodePoint(printable ? b : 256 + shifted++)] = 2 + b;
  }
  const added = (id, content, special) => ({id, content, single_word: false, lstrip: false, rstrip: false,
                                            normalized: false, special});
  const bos = '<｜begin▁of▁sentence｜>', eos = '<｜end▁of▁sentence｜>';
  const tokenizer = {
    version: '1.0', truncation: null, padding: null,
    added_tokens: [added(0, bos, true), added(1, eos, true), added(258, '<｜User｜>', false),
                   added(259, '<｜Assistant｜>', false)],
    normalizer: null,
    pre_tokenizer: {type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false},
    post_processor: null,
    decoder: {type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true},
    model: {type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null,
            fuse_unk: false, byte_fallback: false, vocab, merges: []},
  };
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tokenizer));
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify({
    add_bos_token: false, bos_token: bos, eos_token: eos, tokenizer_class: 'LlamaTokenizerFast'}));
  return dir;
}

test('DeepSeek-V4 oracle fixture (deepseek-v4-tiny) served: DSML calls forced and written, a round trip, thinking',
     async () => {
  await dsmlCheckpointCase(v4FixtureFolder(), 'tool_calls',
                           '<｜User｜><tool_result>21 degrees</tool_result><｜Assistant｜></think>', {dummy: false});
});
