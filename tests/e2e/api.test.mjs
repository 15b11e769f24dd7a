// The API through the official `openai` client against `fathom serve` running the scripted test model
// (lib/fathom.mjs): chat and completions, streamed and not, n = 2, stop and max_tokens, usage, reasoning_content,
// Last-Event-ID resume and API keys.
import {test, before, after} from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import OpenAI from 'openai';
import {buildScriptedModel, dataDir, parseResponse, rawRequest, readSse, sleep, startServer, tmpDir} from './lib/fathom.mjs';

const kAssistant = 128804;  // <｜Assistant｜>: every chat prompt of the DeepSeek-V3 template ends with it
const kKey = 'sk-test-0123456789';
const kFimBegin = 128801, kFimEnd = 128802;  // <｜fim▁begin｜>, <｜fim▁end｜> of the DeepSeek-V3 tokenizer
let srv, client, model;

before(async () => {
  model = buildScriptedModel(path.join(tmpDir('fathom-e2e-'), 'model'), [
    {triggerId: kAssistant, text: 'Let me think.</think>The answer is 4.', end: 'eos'},
    {trigger: 'Count:', text: ' one two three four five six seven eight nine ten', end: 'eos'},
    {trigger: 'Loop', text: ' tick tock', end: 'cycle'},
    {triggerId: kFimEnd, text: ' return a + b', end: 'eos'},
  ]);
  srv = await startServer(['--model', model.dir, '--served-model-name', 'scripted', '--api-key', kKey,
                           '--reasoning-parser', 'deepseek-r1', '--max-model-len', '256', '--metrics-require-key',
                           '--stream-resume-grace-s', '3']);
  client = new OpenAI({baseURL: srv.url + '/v1', apiKey: kKey, maxRetries: 0});
});

after(async () => {
  const code = await srv.stop();
  assert.equal(code, 0, srv.stderr);
});

test('a non-streamed chat splits reasoning_content from content and counts usage', async () => {
  const r = await client.chat.completions.create({model: 'scripted', messages: [{role: 'user', content: 'What is 2+2?'}]});
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.model, 'scripted');
  const c = r.choices[0];
  assert.equal(c.message.role, 'assistant');
  assert.equal(c.message.reasoning_content, 'Let me think.');
  assert.equal(c.message.content, 'The answer is 4.');
  assert.equal(c.finish_reason, 'stop');
  // 11 scripted tokens + EOS; the 6 up to and including the one that closes </think> are reasoning.
  assert.equal(r.usage.completion_tokens, 12);
  assert.equal(r.usage.completion_tokens_details.reasoning_tokens, 6);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 12);
  assert.equal(r.usage.prompt_cache_hit_tokens + r.usage.prompt_cache_miss_tokens, r.usage.prompt_tokens);
});

test('a streamed chat sends role, reasoning deltas, content deltas, a usage chunk and [DONE]', async () => {
  const stream = await client.chat.completions.create({
    model: 'scripted', messages: [{role: 'user', content: [{type: 'text', text: 'What is 2+2?'}]}], stream: true,
    stream_options: {include_usage: true},
  });
  let reasoning = '', content = '', role = null, finish = null, usage = null, timing = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) {
      usage = chunk.usage;
      timing = chunk.fathom_timing;
      assert.equal(chunk.choices.length, 0);
      continue;
    }
    const d = chunk.choices[0].delta;
    if (d.role) role = d.role;
    if (d.reasoning_content) reasoning += d.reasoning_content;
    if (d.content) content += d.content;
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.equal(role, 'assistant');
  assert.equal(reasoning, 'Let me think.');
  assert.equal(content, 'The answer is 4.');
  assert.equal(finish, 'stop');
  assert.ok(chunks >= 5, `only ${chunks} chunks`);
  assert.equal(usage.completion_tokens, 12);
  assert.equal(usage.completion_tokens_details.reasoning_tokens, 6);
  for (const k of ['queue', 'tokenize', 'prefill', 'decode', 'detokenize', 'grammar', 'serialize', 'total']) {
    assert.equal(typeof timing[k], 'number', k);
    assert.ok(timing[k] >= 0, k);
  }
  assert.ok(timing.total >= timing.prefill);
});

test('a completion, its usage and the timing header', async () => {
  const {data: r, response} = await client.completions.create({model: 'scripted', prompt: 'Count:', max_tokens: 50}).withResponse();
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices[0].text, ' one two three four five six seven eight nine ten');
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.usage.completion_tokens, 11);  // ten words + EOS
  assert.ok(response.headers.get('x-request-id'));
  assert.ok(Number(response.headers.get('x-server-timestamp')) > 1.7e9);
  const timing = Object.fromEntries(response.headers.get('x-fathom-timing').split(';').map((kv) => kv.split('=')));
  assert.deepEqual(Object.keys(timing), ['queue', 'tokenize', 'prefill', 'decode', 'detokenize', 'grammar', 'serialize', 'total', 'replica']);
  assert.equal(timing.replica, '0');  // one engine: replica 0
});

test('max_tokens ends with finish_reason length and stop strings with stop', async () => {
  const a = await client.completions.create({model: 'scripted', prompt: 'Count:', max_tokens: 3});
  assert.equal(a.choices[0].text, ' one two three');
  assert.equal(a.choices[0].finish_reason, 'length');
  assert.equal(a.usage.completion_tokens, 3);
  const b = await client.completions.create({model: 'scripted', prompt: 'Count:', max_tokens: 50, stop: [' five', 'xyz']});
  assert.equal(b.choices[0].text, ' one two three four');
  assert.equal(b.choices[0].finish_reason, 'stop');
  const c = await client.chat.completions.create({model: 'scripted', messages: [{role: 'user', content: 'q'}], stop: 'answer'});
  assert.equal(c.choices[0].message.content, 'The ');
  assert.equal(c.choices[0].finish_reason, 'stop');
});

test('n = 2 returns two choices, streamed and not', async () => {
  const r = await client.completions.create({model: 'scripted', prompt: 'Count:', max_tokens: 4, n: 2, temperature: 1, seed: 7});
  assert.equal(r.choices.length, 2);
  assert.deepEqual(r.choices.map((c) => c.index).sort(), [0, 1]);
  for (const c of r.choices) assert.equal(c.text, ' one two three four');
  assert.equal(r.usage.completion_tokens, 8);
  const stream = await client.chat.completions.create({model: 'scripted', messages: [{role: 'user', content: 'q'}], n: 2, stream: true});
  const text = ['', ''];
  const finish = [null, null];
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      text[c.index] += c.delta.content || '';
      if (c.finish_reason) finish[c.index] = c.finish_reason;
    }
  }
  assert.deepEqual(text, ['The answer is 4.', 'The answer is 4.']);
  assert.deepEqual(finish, ['stop', 'stop']);
});

test('prompt token ids, logprobs and the models list', async () => {
  const ids = model.scripts[1].trigger;
  const r = await client.completions.create({model: 'scripted', prompt: [0, ids], max_tokens: 2, logprobs: 2});
  assert.equal(r.choices[0].text, ' one two');
  assert.deepEqual(r.choices[0].logprobs.tokens, [' one', ' two']);
  assert.deepEqual(r.choices[0].logprobs.text_offset, [0, 4]);  // characters into the completion, as vLLM counts
  const streamed = await client.completions.create({model: 'scripted', prompt: 'Count:', max_tokens: 4, logprobs: 1,
                                                    stream: true});
  const offsets = [], tokens = [];
  for await (const chunk of streamed) {
    if (!chunk.choices[0]?.logprobs) continue;
    offsets.push(...chunk.choices[0].logprobs.text_offset);
    tokens.push(...chunk.choices[0].logprobs.tokens);
  }
  assert.deepEqual(tokens, [' one', ' two', ' three', ' four']);
  assert.deepEqual(offsets, [0, 4, 8, 14]);
  for (const lp of r.choices[0].logprobs.token_logprobs) assert.ok(lp > -1e-3 && lp <= 0, String(lp));
  const chat = await client.chat.completions.create({model: 'scripted', messages: [{role: 'user', content: 'q'}], max_tokens: 1,
                                                     logprobs: true, top_logprobs: 2});
  assert.equal(chat.choices[0].logprobs.content.length, 1);
  assert.equal(chat.choices[0].logprobs.content[0].token, 'Let');
  assert.equal(chat.choices[0].logprobs.content[0].top_logprobs.length, 2);
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), ['scripted']);
});

test('errors arrive as OpenAI error bodies through the client', async () => {
  await assert.rejects(client.chat.completions.create({model: 'nope', messages: [{role: 'user', content: 'q'}]}),
                       (e) => e.status === 404 && e.error.code === 'model_not_found' && e.error.param === 'model');
  await assert.rejects(client.chat.completions.create({model: 'scripted', messages: []}),
                       (e) => e.status === 400 && e.error.param === 'messages');
  await assert.rejects(client.completions.create({model: 'scripted', prompt: 'Count:', temperature: 3}),
                       (e) => e.status === 400 && e.error.param === 'temperature' && /\[0, 2\]/.test(e.error.message));
  await assert.rejects(client.chat.completions.create({model: 'scripted', messages: [{role: 'user', content: 'q'}],
                                                       tools: [{type: 'function', function: {name: 'f', parameters: {}}}],
                                                       tool_choice: {type: 'function', function: {name: 'g'}}}),
                       (e) => e.status === 400 && e.error.param === 'tool_choice');
  await assert.rejects(client.chat.completions.create({model: 'scripted', messages: [{role: 'user', content: 'q'}],
                                                       response_format: {type: 'json_schema', json_schema: {name: 'x', schema: {not: {}}}}}),
                       (e) => e.status === 400 && e.error.param === 'response_format' && /'not'/.test(e.error.message));
  await assert.rejects(client.completions.create({model: 'scripted', prompt: 'x '.repeat(300), max_tokens: 10}),
                       (e) => e.status === 400 && e.error.code === 'context_length_exceeded' && /256/.test(e.error.message));
});

test("DeepSeek's URL forms: no /v1, and /beta, reach the /v1 routes with the same auth and metrics", async () => {
  // @ai-sdk/deepseek and ChatDeepSeek default to https://api.deepseek.com; /beta is DeepSeek's prefix/FIM base URL.
  const auth = {Authorization: `Bearer ${kKey}`};
  const latencyCount = async () => {
    const text = await (await fetch(srv.url + '/metrics', {headers: auth})).text();
    const m = text.match(/^fathom_request_latency_seconds_count(?:\{[^}]*\})? (\d+)/m);
    assert.ok(m, 'no fathom_request_latency_seconds_count');
    return Number(m[1]);
  };
  const before = await latencyCount();
  for (const base of [srv.url, srv.url + '/beta']) {
    const c = new OpenAI({baseURL: base, apiKey: kKey, maxRetries: 0});
    const chat = await c.chat.completions.create({model: 'scripted', messages: [{role: 'user', content: 'What is 2+2?'}]});
    assert.equal(chat.choices[0].message.content, 'The answer is 4.', base);
    const done = await c.completions.create({model: 'scripted', prompt: 'Count:', max_tokens: 3});
    assert.equal(done.choices[0].text, ' one two three', base);
    const models = await c.models.list();
    assert.deepEqual(models.data.map((m) => m.id), ['scripted'], base);
    const unauthorized = new OpenAI({baseURL: base, apiKey: 'sk-wrong', maxRetries: 0});
    await assert.rejects(unauthorized.models.list(), (e) => e.status === 401, base);
  }
  // Prefix completion under /beta, as @ai-sdk/deepseek sends it there.
  const beta = new OpenAI({baseURL: srv.url + '/beta', apiKey: kKey, maxRetries: 0});
  const prefixed = await beta.chat.completions.create({model: 'scripted', max_tokens: 4, messages: [
    {role: 'user', content: 'Count:'}, {role: 'assistant', content: 'Count:', prefix: true}]});
  assert.equal(prefixed.object, 'chat.completion');
  // The generations were counted under the canonical routes (the latency histogram counts /v1 generations only).
  assert.equal(await latencyCount(), before + 5);
  const other = await fetch(srv.url + '/v2/chat/completions', {method: 'POST', headers: auth, body: '{}'});
  assert.equal(other.status, 404);
  assert.match((await other.json()).error.message, /no route POST \/v2\/chat\/completions/);
});

test("DeepSeek's `thinking` is refused where the model cannot honour it; unknown fields are ignored and logged", async () => {
  // The scripted model has DeepSeek-V3's template: no thinking switch, no <think> of its own.
  const messages = [{role: 'user', content: 'What is 2+2?'}];
  await assert.rejects(client.chat.completions.create({model: 'scripted', messages, thinking: {type: 'enabled'}}),
                       (e) => e.status === 400 && e.param === 'thinking' && /no thinking mode/.test(e.message));
  await assert.rejects(client.chat.completions.create({model: 'scripted', messages, thinking: {type: 'auto'}}),
                       (e) => e.status === 400 && e.param === 'thinking.type');
  const off = await client.chat.completions.create({model: 'scripted', messages, thinking: {type: 'disabled'}});
  assert.equal(off.object, 'chat.completion');
  // Known but not honoured: refused by name.
  await assert.rejects(client.chat.completions.create({model: 'scripted', messages, reasoning_effort: 'low'}),
                       (e) => e.status === 400 && e.param === 'reasoning_effort' && e.code === 'unsupported_parameter');
  // Unknown: ignored, and named once in the server's log.
  const unknown = await client.chat.completions.create({model: 'scripted', messages, frobnicate_e2e: {x: 1}});
  assert.equal(unknown.choices[0].message.content, 'The answer is 4.');
  assert.match(srv.stderr, /ignored the unknown field\(s\) 'frobnicate_e2e'/);
});

test('a bad or missing API key gets 401; /health needs none', async () => {
  const bad = new OpenAI({baseURL: srv.url + '/v1', apiKey: 'sk-wrong', maxRetries: 0});
  await assert.rejects(bad.models.list(), (e) => e.status === 401 && e.error.type === 'authentication_error');
  const none = await fetch(srv.url + '/v1/models');
  assert.equal(none.status, 401);
  assert.equal((await fetch(srv.url + '/health')).status, 200);
});

test('event ids are opt-in; a dropped stream is resumed from Last-Event-ID, and a resume always carries ids', async () => {
  const plainBody = {model: 'scripted', prompt: 'Count:', max_tokens: 50, stream: true};
  const headers = {'content-type': 'application/json', authorization: `Bearer ${kKey}`};
  const post = async (b, h = headers) => readSse(await fetch(srv.url + '/v1/completions', {method: 'POST', headers: h, body: JSON.stringify(b)}));
  // By default no `id:` lines, as in OpenAI's API.
  const plain = await post(plainBody);
  assert.ok(plain.length > 3 && plain.every((e) => e.id === undefined), JSON.stringify(plain.slice(0, 2)));
  // Asked for with the header, or with stream_options.event_ids.
  const viaHeader = await post(plainBody, {...headers, 'x-fathom-event-ids': '1'});
  assert.deepEqual(viaHeader.map((e) => e.id), viaHeader.map((_, i) => i + 1));
  const body = {...plainBody, stream_options: {event_ids: true}};
  const full = await post(body);
  const ids = full.map((e) => e.id);
  assert.deepEqual(ids, ids.map((_, i) => i + 1));
  // The plain stream was logged too: its replay carries ids.
  const replay = await readSse(await fetch(srv.url + `/v1/streams/${JSON.parse(plain[0].data).id}`, {headers}));
  assert.deepEqual(replay.map((e) => e.id), plain.map((_, i) => i + 1));
  assert.deepEqual(replay.map((e) => e.data), plain.map((e) => e.data));
  const bad = await fetch(srv.url + '/v1/completions', {method: 'POST', headers,
                                                        body: JSON.stringify({...plainBody, stream_options: {event_ids: 1}})});
  assert.equal(bad.status, 400);
  assert.equal((await bad.json()).error.param, 'stream_options.event_ids');
  assert.equal(full.at(-1).data, '[DONE]');
  const first = JSON.parse(full[0].data);
  // Reconnect as if only the first three events had arrived.
  const resumed = await fetch(srv.url + `/v1/streams/${first.id}`, {headers: {...headers, 'last-event-id': '3'}});
  assert.equal(resumed.status, 200);
  const rest = await readSse(resumed);
  assert.deepEqual(rest.map((e) => e.id), ids.slice(3));
  const text = [...full.slice(0, 3), ...rest].filter((e) => e.data !== '[DONE]').map((e) => JSON.parse(e.data).choices[0].text).join('');
  assert.equal(text, ' one two three four five six seven eight nine ten');
  const missing = await fetch(srv.url + '/v1/streams/cmpl-nope', {headers});
  assert.equal(missing.status, 404);
});

const auth = {authorization: `Bearer ${kKey}`};

// Sends `request` as raw bytes: each character below U+0100 is one byte (so '\xff' is the byte 0xff).
function raw(request) {
  return rawRequest(srv.port, [Buffer.from(request, 'latin1')]).then((r) => parseResponse(r.data));
}

test('requests that once crashed the server get error answers, and it stays up', async () => {
  // A wrong type in /tokenize (was an uncaught type_error from body.value()).
  const t = await fetch(srv.url + '/tokenize', {method: 'POST', headers: {...auth, 'content-type': 'application/json'},
                                                body: JSON.stringify({prompt: 'hi', add_special_tokens: 'x'})});
  assert.equal(t.status, 400);
  assert.equal((await t.json()).error.param, 'add_special_tokens');
  // A non-UTF-8 path, unauthenticated (its 404 body once threw in serialization), and a non-UTF-8 stream id.
  const p = await raw('GET /\xff HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
  assert.equal(p.status, 404);
  assert.match(JSON.parse(p.body).error.message, /no route GET \/\ufffd/);
  const s = await raw(`GET /v1/streams/\xc3\x28 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${kKey}\r\nConnection: close\r\n\r\n`);
  assert.equal(s.status, 404);
  assert.equal(JSON.parse(s.body).error.code, 'stream_not_found');
  assert.equal((await fetch(srv.url + '/health')).status, 200);
});

test('the Bearer scheme is case-insensitive; /metrics can require the key', async () => {
  const lower = await fetch(srv.url + '/v1/models', {headers: {authorization: `bearer ${kKey}`}});
  assert.equal(lower.status, 200);
  assert.equal((await fetch(srv.url + '/v1/models', {headers: {authorization: `Basic ${kKey}`}})).status, 401);
  assert.equal((await fetch(srv.url + '/metrics')).status, 401);
  const m = await fetch(srv.url + '/metrics', {headers: auth});
  assert.equal(m.status, 200);
  // Nothing so far reached the exception barrier: each count is a bug.
  for (const line of (await m.text()).split('\n').filter((l) => l.startsWith('fathom_internal_errors_total'))) {
    assert.match(line, / 0$/, line);
  }
});

test('stream ids are 128 random bits, named in a header; Last-Event-ID must be plain digits', async () => {
  const headers = {'content-type': 'application/json', ...auth};
  const r = await fetch(srv.url + '/v1/completions', {method: 'POST', headers,
                                                     body: JSON.stringify({prompt: 'Count:', max_tokens: 3, stream: true})});
  const id = r.headers.get('x-fathom-stream-id');
  assert.match(id, /^cmpl-[0-9a-f]{32}$/);
  const events = await readSse(r);
  assert.equal(JSON.parse(events[0].data).id, id);
  for (const bad of ['-1', '+1', '1 2', '0x10', '99999999999999999999']) {
    const x = await raw(`GET /v1/streams/${id} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${kKey}\r\n` +
                        `Last-Event-ID: ${bad}\r\nConnection: close\r\n\r\n`);
    assert.equal(x.status, 400, bad);
    assert.equal(JSON.parse(x.body).error.param, 'Last-Event-ID');
  }
});

// Reads a stream until `n` events arrived, then drops the connection.
async function dropAfter(body, n) {
  const controller = new AbortController();
  const r = await fetch(srv.url + '/v1/completions', {method: 'POST', signal: controller.signal,
                                                     headers: {'content-type': 'application/json', ...auth},
                                                     body: JSON.stringify(body)});
  const id = r.headers.get('x-fathom-stream-id');
  const got = [];
  try {
    await readSse(r, {onEvent: (e) => {
      got.push(e);
      if (got.length === n) controller.abort();
    }});
  } catch (e) {
    assert.equal(e.name, 'AbortError');
  }
  return {id, got};
}

test('a resumable stream keeps generating after its client drops, and a resume gets the rest and [DONE]', async () => {
  const body = {prompt: 'Loop', max_tokens: 60, stream: true, stream_options: {resumable: true}};
  const whole = await readSse(await fetch(srv.url + '/v1/completions', {
    method: 'POST', headers: {'content-type': 'application/json', ...auth}, body: JSON.stringify(body)}));
  const text = (events) => events.filter((e) => e.data !== '[DONE]').map((e) => JSON.parse(e.data).choices[0].text).join('');
  const {id, got} = await dropAfter(body, 3);
  const resumed = await fetch(srv.url + `/v1/streams/${id}`, {headers: {...auth, 'last-event-id': String(got.at(-1).id)}});
  assert.equal(resumed.status, 200);
  const rest = await readSse(resumed);
  assert.equal(rest.at(-1).data, '[DONE]');
  const chunks = [...got, ...rest].filter((e) => e.data !== '[DONE]').map((e) => JSON.parse(e.data).choices[0]);
  assert.equal(chunks.at(-1).finish_reason, 'length');  // ran to max_tokens: not aborted by the drop
  assert.equal(text([...got, ...rest]), text(whole));
});

test('a resumable stream nobody resumes is aborted after the grace period; others are aborted at once', async () => {
  const local = await startServer(['--model', model.dir, '--stream-resume-grace-s', '1', '--access-log', 'off']);
  try {
    const open = async (body, n) => {
      const controller = new AbortController();
      const r = await fetch(local.url + '/v1/completions', {method: 'POST', signal: controller.signal,
                                                             headers: {'content-type': 'application/json'},
                                                             body: JSON.stringify(body)});
      const id = r.headers.get('x-fathom-stream-id');
      try {
        await readSse(r, {onEvent: (e, all) => (all.length === n ? controller.abort() : undefined)});
      } catch (e) {
        assert.equal(e.name, 'AbortError');
      }
      return id;
    };
    const replay = async (id) => readSse(await fetch(local.url + `/v1/streams/${id}`, {headers: {'last-event-id': '0'}}));
    const resumable = await open({prompt: 'Loop', max_tokens: 4000, stream: true, stream_options: {resumable: true}}, 2);
    await sleep(2500);  // past the grace period of 1 s
    const late = await replay(resumable);
    assert.equal(late.at(-1).data, '[DONE]');
    assert.equal(JSON.parse(late.at(-2).data).choices[0].finish_reason, 'abort');
    const plain = await open({prompt: 'Loop', max_tokens: 4000, stream: true}, 2);
    await sleep(300);
    const cut = await replay(plain);
    assert.equal(cut.at(-1).data, '[DONE]');
    assert.equal(JSON.parse(cut.at(-2).data).choices[0].finish_reason, 'abort');
    assert.ok(cut.length < late.length, `${cut.length} events after a plain drop, ${late.length} after the grace`);
  } finally {
    await local.stop('SIGKILL');
  }
});

test('FIM: a completion with a suffix is prompted as <｜fim▁begin｜>prompt<｜fim▁hole｜>suffix<｜fim▁end｜>', async () => {
  const prompt = 'def add(a, b):\n', suffix = '\n\nprint(add(1, 2))\n';
  const r = await client.completions.create({model: 'scripted', prompt, suffix, max_tokens: 20});
  assert.equal(r.choices[0].text, ' return a + b');
  assert.equal(r.choices[0].finish_reason, 'stop');
  // The prompt is the FIM string as the tokenizer encodes it: BOS, then the FIM tokens around the two texts.
  const tok = await (await fetch(srv.url + '/tokenize', {
    method: 'POST', headers: {'content-type': 'application/json', authorization: `Bearer ${kKey}`},
    body: JSON.stringify({prompt: `<｜fim▁begin｜>${prompt}<｜fim▁hole｜>${suffix}<｜fim▁end｜>`})})).json();
  assert.equal(r.usage.prompt_tokens, tok.count);
  assert.equal(tok.tokens[1], kFimBegin);
  assert.equal(tok.tokens.at(-1), kFimEnd);
  // Streamed, the same text.
  const stream = await client.completions.create({model: 'scripted', prompt, suffix, max_tokens: 20, stream: true});
  let text = '';
  for await (const chunk of stream) text += chunk.choices.length > 0 ? chunk.choices[0].text : '';
  assert.equal(text, ' return a + b');
  // An empty or null suffix is a plain completion; a suffix with a token-id prompt is a 400 naming it.
  const plain = await client.completions.create({model: 'scripted', prompt: 'Count:', suffix: '', max_tokens: 3});
  assert.equal(plain.choices[0].text, ' one two three');
  await assert.rejects(client.completions.create({model: 'scripted', prompt: [1, 2, 3], suffix: 'x', max_tokens: 3}),
                       (e) => e.status === 400 && e.error.param === 'suffix' && /needs a text prompt/.test(e.message));
});

// DeepSeek-V3.2's built-in encoding (--chat-template deepseek_v32; picked by itself for a deepseek_v32 checkpoint
// without a template): `thinking` opens <think> at the end of the prompt, and only then is the output reasoning first.
// The script continues both "<think>" and "</think>" (their last token) with the same answer: reasoning_content when
// thinking, content when not, from one server with the reasoning parser on auto.
test('DeepSeek-V3.2 encoding: thinking decides, per request, whether the output is reasoning', async () => {
  const m = buildScriptedModel(path.join(tmpDir('fathom-v32-'), 'model'), [
    {trigger: '<｜Assistant｜></think>', text: 'The answer is 4.', end: 'eos'},
  ]);
  const local = await startServer(['--model', m.dir, '--served-model-name', 'm', '--chat-template', 'deepseek_v32',
                                   '--access-log', 'off']);
  try {
    const c = new OpenAI({baseURL: local.url + '/v1', apiKey: 'x', maxRetries: 0});
    const ask = (type) => c.chat.completions.create({model: 'm', messages: [{role: 'user', content: 'What is 2+2?'}],
                                                     max_tokens: 12, thinking: {type}});
    const off = (await ask('disabled')).choices[0].message;
    assert.equal(off.content, 'The answer is 4.');
    assert.equal(off.reasoning_content ?? null, null);
    const on = (await ask('enabled')).choices[0].message;
    assert.equal(on.reasoning_content, 'The answer is 4.');  // the block never closes: all of it is reasoning
    assert.ok(!on.content, JSON.stringify(on));
  } finally {
    await local.stop();
  }
});

test('FIM: a model whose tokenizer has no FIM tokens answers 400 naming suffix', async () => {
  const dir = tmpDir('fathom-nofim-');
  const src = path.join(dataDir, 'tokenizers/qwen3');
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), zlib.gunzipSync(fs.readFileSync(path.join(src, 'tokenizer.json.gz'))));
  fs.copyFileSync(path.join(src, 'tokenizer_config.json'), path.join(dir, 'tokenizer_config.json'));
  const local = await startServer(['--model', model.dir, '--tokenizer', dir, '--access-log', 'off']);
  try {
    const r = await fetch(local.url + '/v1/completions', {method: 'POST', headers: {'content-type': 'application/json'},
                                                         body: JSON.stringify({prompt: 'def f(', suffix: '):'})});
    assert.equal(r.status, 400);
    const e = (await r.json()).error;
    assert.equal(e.param, 'suffix');
    assert.match(e.message, /needs a model with FIM tokens/);
  } finally {
    await local.stop();
  }
});
