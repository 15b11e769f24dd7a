// Tool calls through the official openai client, against the demo model (DeepSeek-V3's template and tokenizer, random
// weights): tool_choice required and named (a grammar of calls in DeepSeek's format, so every call is valid however
// noisy the model), auto (the model's text parsed; a guided_regex plays the model that calls a tool), streamed and
// not, parallel_tool_calls, the history of calls rendered back, and the errors.
import {test, before, after} from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import OpenAI from 'openai';
import {dataDir, startServer, tmpDir, writeTokenizer} from './lib/fathom.mjs';

let srv, client;
before(async () => {
  srv = await startServer(['--access-log', 'off']);
  client = new OpenAI({baseURL: srv.url + '/v1', apiKey: 'x', maxRetries: 0});
});
after(async () => { await srv.stop(); });

const tools = [
  {type: 'function', function: {name: 'get_weather', description: 'Current weather of a city',
    parameters: {type: 'object', properties: {city: {type: 'string', maxLength: 10}, unit: {enum: ['c', 'f']}},
                 required: ['city', 'unit'], additionalProperties: false}}},
  {type: 'function', function: {name: 'get_time', description: 'Time of a zone',
    parameters: {type: 'object', properties: {zone: {enum: ['UTC', 'CET']}}, required: ['zone'],
                 additionalProperties: false}}},
];
const messages = [{role: 'user', content: 'What is the weather in Paris?'}];

function checkCall(call) {
  assert.equal(call.type, 'function');
  assert.match(call.id, /^call_/);
  const args = JSON.parse(call.function.arguments);
  if (call.function.name === 'get_weather') {
    assert.deepEqual(Object.keys(args), ['city', 'unit']);
    assert.ok(typeof args.city === 'string' && [...args.city].length <= 10, call.function.arguments);
    assert.ok(['c', 'f'].includes(args.unit));
  } else {
    assert.equal(call.function.name, 'get_time');
    assert.ok(['UTC', 'CET'].includes(args.zone), call.function.arguments);
  }
}

// Joins streamed tool-call deltas as a client does: by index, id and name from the first, arguments appended.
async function collect(stream) {
  const calls = [];
  let content = '', finish = null;
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    content += c.delta?.content ?? '';
    for (const d of c.delta?.tool_calls ?? []) {
      if (!calls[d.index]) {
        assert.ok(d.id && d.function?.name, 'the first delta of a call carries its id and name');
        calls[d.index] = {id: d.id, type: d.type, function: {name: d.function.name, arguments: ''}};
      }
      calls[d.index].function.arguments += d.function?.arguments ?? '';
    }
    finish = c.finish_reason ?? finish;
  }
  return {calls, content, finish};
}

test('tool_choice required: calls of the given tools with arguments that follow their schemas', async () => {
  for (const seed of [1, 2, 3]) {
    const r = await client.chat.completions.create({model: 'deepseek-chat', messages, tools, tool_choice: 'required',
                                                    parallel_tool_calls: false, max_tokens: 150, seed});
    const m = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    assert.equal(m.content, null);
    assert.equal(m.tool_calls.length, 1);
    checkCall(m.tool_calls[0]);
  }
  // With parallel calls allowed, every call is still valid.
  const r = await client.chat.completions.create({model: 'deepseek-chat', messages, tools, tool_choice: 'required',
                                                  max_tokens: 300, seed: 5});
  assert.ok(r.choices[0].message.tool_calls.length >= 1);
  if (r.choices[0].finish_reason === 'tool_calls') r.choices[0].message.tool_calls.forEach(checkCall);
});

test('a named tool_choice, streamed: deltas in OpenAI shape that join into one call of that tool', async () => {
  const stream = await client.chat.completions.create({
    model: 'deepseek-chat', messages, tools, tool_choice: {type: 'function', function: {name: 'get_time'}},
    max_tokens: 100, seed: 4, stream: true});
  const {calls, content, finish} = await collect(stream);
  assert.equal(finish, 'tool_calls');
  assert.equal(content, '');
  assert.equal(calls.length, 1);
  assert.equal(calls[0].function.name, 'get_time');
  checkCall(calls[0]);
});

// The text a DeepSeek model writes when it calls get_weather (a regex makes the random model write it).
const deepseekCall = '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n' +
                     '\\{"city": "(Paris|Rome)", "unit": "c"\\}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>';

// max_tokens in the tests below covers each regex's text byte by byte (196 and 283 bytes): the random model may spell
// the text, the markers' fullwidth characters included, in single-byte tokens, and a shorter limit then ends it at
// 'length' now and then.
test('tool_choice auto parses the calls the model writes, streamed and not', async () => {
  const r = await client.chat.completions.create({model: 'deepseek-chat', messages, tools, max_tokens: 256,
                                                  guided_regex: 'Checking\\. ' + deepseekCall});
  const m = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(m.content, 'Checking. ');
  assert.equal(m.tool_calls.length, 1);
  assert.equal(m.tool_calls[0].function.name, 'get_weather');
  assert.match(m.tool_calls[0].function.arguments, /^\{"city": "(Paris|Rome)", "unit": "c"\}$/);
  const s = await collect(await client.chat.completions.create({model: 'deepseek-chat', messages, tools, max_tokens: 256,
                                                                stream: true, guided_regex: deepseekCall}));
  assert.equal(s.finish, 'tool_calls');
  assert.equal(s.content, '');
  assert.equal(s.calls.length, 1);
  assert.match(s.calls[0].function.arguments, /^\{"city": "(Paris|Rome)", "unit": "c"\}$/);
  // A model that answers in text: content, no tool_calls.
  const text = await client.chat.completions.create({model: 'deepseek-chat', messages, tools, max_tokens: 20,
                                                     guided_regex: 'It is sunny\\.'});
  assert.equal(text.choices[0].message.content, 'It is sunny.');
  assert.equal(text.choices[0].message.tool_calls, undefined);
  assert.equal(text.choices[0].finish_reason, 'stop');
});

test('parallel_tool_calls false keeps the first of several calls', async () => {
  const two = '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n\\{"zone": "UTC"\\}' +
              '\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n' +
              '\\{"zone": "CET"\\}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>';
  const all = await client.chat.completions.create({model: 'deepseek-chat', messages, tools, max_tokens: 320,
                                                    guided_regex: two});
  assert.deepEqual(all.choices[0].message.tool_calls.map((c) => c.function.arguments),
                   ['{"zone": "UTC"}', '{"zone": "CET"}']);
  const one = await client.chat.completions.create({model: 'deepseek-chat', messages, tools, max_tokens: 320,
                                                    guided_regex: two, parallel_tool_calls: false});
  assert.deepEqual(one.choices[0].message.tool_calls.map((c) => c.function.arguments), ['{"zone": "UTC"}']);
});

test('assistant tool_calls and tool results in the history are rendered in the model\'s format', async () => {
  const history = [
    {role: 'user', content: 'Weather in Paris?'},
    {role: 'assistant', content: null, tool_calls: [{id: 'call_1', type: 'function',
      function: {name: 'get_weather', arguments: '{"city":"Paris","unit":"c"}'}}]},
    {role: 'tool', tool_call_id: 'call_1', content: '18 degrees'},
  ];
  const body = {model: 'deepseek-chat', messages: history, tools};
  const tok = await (await fetch(srv.url + '/tokenize', {method: 'POST', body: JSON.stringify(body)})).json();
  const text = (await (await fetch(srv.url + '/detokenize', {method: 'POST',
                                                            body: JSON.stringify({tokens: tok.tokens})})).json()).prompt;
  assert.ok(text.includes('### get_weather\nDescription: Current weather of a city'), text);
  assert.ok(text.includes('<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n' +
                          '```json\n{"city":"Paris","unit":"c"}\n```<｜tool▁call▁end｜>'), text);
  assert.ok(text.includes('<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>18 degrees<｜tool▁output▁end｜>'), text);
  const r = await client.chat.completions.create({model: 'deepseek-chat', messages: history, tools, max_tokens: 5});
  assert.equal(r.choices[0].finish_reason, 'length');
  // tool_choice none: the tools stay out of the prompt.
  const none = await (await fetch(srv.url + '/tokenize', {method: 'POST',
                                                         body: JSON.stringify({...body, tool_choice: 'none'})})).json();
  assert.ok(none.count < tok.count);
});

test('bad tools and tool choices are 400s that name the field', async () => {
  await assert.rejects(client.chat.completions.create({model: 'deepseek-chat', messages, tools,
                                                       tool_choice: {type: 'function', function: {name: 'nope'}}}),
                       (e) => e.status === 400 && e.error.param === 'tool_choice' && /'nope'/.test(e.error.message));
  await assert.rejects(client.chat.completions.create({model: 'deepseek-chat', messages, tool_choice: 'required',
                                                       tools: [{type: 'function', function: {name: 'f',
                                                         parameters: {type: 'object', not: {}}}}]}),
                       (e) => e.status === 400 && e.error.param === 'tools' && /tool 'f'.*'not'/.test(e.error.message));
  await assert.rejects(client.chat.completions.create({model: 'deepseek-chat', messages, tools, tool_choice: 'required',
                                                       response_format: {type: 'json_object'}}),
                       (e) => e.status === 400 && e.error.param === 'tool_choice');
  await assert.rejects(client.chat.completions.create({model: 'deepseek-chat', messages,
                                                       tools: [{type: 'function', function: {name: 'bad name'}}]}),
                       (e) => e.status === 400 && e.error.param === 'tools[0].function.name');
  const ok = await client.chat.completions.create({model: 'deepseek-chat', messages, tools, max_tokens: 3});
  assert.equal(ok.choices[0].finish_reason, 'length');
});

test('a call cut short by max_tokens inside its markup leaves none in content, name or arguments, streamed or not',
     async () => {
  const named = {type: 'function', function: {name: 'get_weather'}};
  const ask = (extra) => client.chat.completions.create({model: 'deepseek-chat', messages, tools, tool_choice: named,
                                                        seed: 11, ...extra});
  const whole = await ask({max_tokens: 200, logprobs: true});
  const full = whole.choices[0].message.tool_calls[0].function.arguments;
  checkCall(whole.choices[0].message.tool_calls[0]);
  // The cuts: after each token that is part of the format's markup (a byte of '<', '｜', '▁' or '`': the random
  // model spells markers in pieces), spread over the call, and one inside the arguments. A request costs seconds
  // under ASan in CI, so six cuts, not every one (a sweep of all of them took 877 s there).
  const pieces = whole.choices[0].logprobs.content.map((t) => Buffer.from(t.bytes));
  const markup = (b) => b.some((x) => x === 0x3c || x === 0x60 || x >= 0x80);
  const inMarkup = [];
  for (let k = 1; k < pieces.length - 1; k++) if (markup(pieces[k - 1])) inMarkup.push(k);
  assert.ok(inMarkup.length > 0, 'no markup tokens in the call');
  const cuts = new Set([1, Math.floor(pieces.length / 2), pieces.length - 2]);
  for (let i = 0; i < 3; i++) cuts.add(inMarkup[Math.floor(i * (inMarkup.length - 1) / 2)]);
  const check = (content, calls, finish, k) => {
    assert.equal(finish, 'length', `max_tokens ${k}`);
    assert.ok(!/[<｜�]|```|tool▁/.test(content ?? ''), `max_tokens ${k}: markup in content ${JSON.stringify(content)}`);
    for (const c of calls ?? []) {
      assert.equal(c.function.name, 'get_weather', `max_tokens ${k}: a partial name`);
      assert.ok(full.startsWith(c.function.arguments), `max_tokens ${k}: ${JSON.stringify(c.function.arguments)}`);
    }
  };
  let withCall = 0;
  for (const k of [...cuts].sort((a, b) => a - b)) {
    const r = await ask({max_tokens: k});
    const m = r.choices[0].message;
    check(m.content, m.tool_calls, r.choices[0].finish_reason, k);
    withCall += (m.tool_calls ?? []).length;
    if (k === pieces.length - 2) {
      const st = await collect(await ask({max_tokens: k, stream: true}));
      check(st.content, st.calls.filter(Boolean), st.finish, k);
      assert.deepEqual(st.calls.map((c) => c.function.arguments), (m.tool_calls ?? []).map((c) => c.function.arguments));
    }
  }
  assert.ok(withCall > 0, 'no cut happened inside the arguments');
});

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
// (tests/server/tools_test.cc), and the API paths of both are the cases above, on DeepSeek-V3's format.)
async function dsmlCheckpointCase(dir, block, resultsEnd) {
  const local = await startServer(['--model', path.join(dir, 'config.json'), '--load-format', 'dummy', '--tokenizer',
                                   dir, '--served-model-name', 'deepseek-chat', '--access-log', 'off']);
  try {
    const c = new OpenAI({baseURL: local.url + '/v1', apiKey: 'x', maxRetries: 0});
    const forced = await c.chat.completions.create({model: 'deepseek-chat', messages, tools, tool_choice: 'required',
                                                    parallel_tool_calls: false, max_tokens: 400, seed: 1});
    const m = forced.choices[0].message;
    assert.equal(forced.choices[0].finish_reason, 'tool_calls');
    assert.equal(m.content, null);
    assert.equal(m.tool_calls.length, 1);
    checkCall(m.tool_calls[0]);
    // max_tokens covers the texts byte by byte (the random model may spell them so), as above.
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
    const ask = (type) => c.chat.completions.create({model: 'deepseek-chat', messages, max_tokens: 6, seed: 3,
                                                     thinking: {type}});
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
