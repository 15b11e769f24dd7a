// Third-party clients as written: the request loop of vLLM's benchmark client (benchmarks/backend_request_func.py,
// async_request_openai_completions and async_request_openai_chat_completions; SGLang's bench_serving.py parses the
// same way), reproduced here line for line in JavaScript. It reads the body line by line, skips empty lines, strips
// a "data: " prefix and hands everything else to a JSON parser, so any other SSE field (an `id:` line) fails it.
// Sixteen requests at once against `fathom serve`, streamed completions and chat; each must succeed with the right
// token count.
import {test, before, after} from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import {buildScriptedModel, startServer, tmpDir} from './lib/fathom.mjs';

const kAssistant = 128804;  // <｜Assistant｜>: every chat prompt of the DeepSeek-V3 template ends with it
let srv;

before(async () => {
  const model = buildScriptedModel(path.join(tmpDir('fathom-e2e-'), 'model'), [
    {triggerId: kAssistant, text: 'Let me think.</think>The answer is 4.', end: 'eos'},
    {trigger: 'Loop', text: ' tick tock', end: 'cycle'},
  ]);
  srv = await startServer(['--model', model.dir, '--served-model-name', 'scripted', 'deepseek-chat,deepseek-reasoner', '--reasoning-parser',
                           'deepseek-r1', '--max-model-len', '256', '--access-log', 'off']);
});

after(async () => {
  assert.equal(await srv.stop(), 0, srv.stderr);
});

// aiohttp's `async for chunk_bytes in response.content`: one line at a time, newline included.
async function* lines(response) {
  const decoder = new TextDecoder();
  let buf = '';
  for await (const chunk of response.body) {
    buf += decoder.decode(chunk, {stream: true});
    let i;
    while ((i = buf.indexOf('\n')) >= 0) {
      yield buf.slice(0, i + 1);
      buf = buf.slice(i + 1);
    }
  }
  if (buf) yield buf;
}

// The loop of async_request_openai_completions / _chat_completions: returns {success, text, outputTokens, error}.
async function vllmStyleRequest(url, payload, chat) {
  const output = {success: false, text: '', outputTokens: null, error: ''};
  try {
    const response = await fetch(url, {method: 'POST', headers: {'Content-Type': 'application/json',
                                                                   Authorization: 'Bearer EMPTY'},
                                       body: JSON.stringify(payload)});
    if (response.status !== 200) {
      output.error = `${response.status} ${await response.text()}`;
      return output;
    }
    for await (let chunkBytes of lines(response)) {
      chunkBytes = chunkBytes.trim();
      if (!chunkBytes) continue;
      const chunk = chunkBytes.startsWith('data: ') ? chunkBytes.slice(6) : chunkBytes;  // removeprefix
      if (chunk === '[DONE]') continue;
      const data = JSON.parse(chunk);  // json.loads: throws on anything that is not JSON
      if (data.choices && data.choices.length > 0) {
        output.text += chat ? (data.choices[0].delta.content ?? '') : (data.choices[0].text ?? '');
      } else if (data.usage) {
        output.outputTokens = data.usage.completion_tokens;
      }
    }
    output.success = true;
  } catch (e) {
    output.error = String(e);
  }
  return output;
}

test('vLLM-style streamed completions: 16 at once, every one succeeds with the right token count', async () => {
  const payload = {model: 'scripted', prompt: 'Loop', temperature: 0.0, max_tokens: 40, stream: true,
                   stream_options: {include_usage: true}, ignore_eos: true};
  const whole = await (await fetch(srv.url + '/v1/completions', {method: 'POST', headers: {'content-type': 'application/json'},
                                                               body: JSON.stringify({...payload, stream: false})})).json();
  assert.match(whole.choices[0].text, /^( tick tock)+/);
  const outs = await Promise.all(Array.from({length: 16}, () => vllmStyleRequest(srv.url + '/v1/completions', payload, false)));
  for (const o of outs) {
    assert.ok(o.success, o.error);
    assert.equal(o.outputTokens, 40);
    assert.equal(o.text, whole.choices[0].text);
  }
});

test('vLLM-style streamed chat: 16 at once, every one succeeds with the right token count', async () => {
  const payload = {model: 'scripted', messages: [{role: 'user', content: 'What is 2+2?'}], temperature: 0.0,
                   max_completion_tokens: 64, stream: true, stream_options: {include_usage: true}};
  const outs = await Promise.all(Array.from({length: 16}, () => vllmStyleRequest(srv.url + '/v1/chat/completions', payload, true)));
  for (const o of outs) {
    assert.ok(o.success, o.error);
    assert.equal(o.outputTokens, 12);  // 11 scripted tokens + EOS
    assert.equal(o.text, 'The answer is 4.');  // the reasoning went to reasoning_content
  }
});

test('the same loop fails on a stream that asked for event ids: what the default protects', async () => {
  const payload = {model: 'scripted', prompt: 'Loop', max_tokens: 4, stream: true, stream_options: {event_ids: true}};
  const o = await vllmStyleRequest(srv.url + '/v1/completions', payload, false);
  assert.equal(o.success, false);
  assert.match(o.error, /JSON/);
});

test('several --served-model-name: a DeepSeek client names deepseek-chat or deepseek-reasoner unchanged', async () => {
  const models = await (await fetch(srv.url + '/v1/models')).json();
  assert.deepEqual(models.data.map((m) => m.id), ['scripted', 'deepseek-chat', 'deepseek-reasoner']);
  for (const name of ['deepseek-chat', 'deepseek-reasoner']) {
    const r = await fetch(srv.url + '/v1/chat/completions', {method: 'POST', headers: {'content-type': 'application/json'},
      body: JSON.stringify({model: name, messages: [{role: 'user', content: 'What is 2+2?'}]})});
    assert.equal(r.status, 200);
    const body = await r.json();
    assert.equal(body.model, name);  // named as the client asked
    assert.equal(body.choices[0].message.content, 'The answer is 4.');
  }
  const missing = await fetch(srv.url + '/v1/completions', {method: 'POST', headers: {'content-type': 'application/json'},
                                                            body: JSON.stringify({model: 'gpt-4', prompt: 'x'})});
  assert.equal(missing.status, 404);
  assert.match((await missing.json()).error.message, /'scripted', 'deepseek-chat', 'deepseek-reasoner'/);
});

test('prefix completion (DeepSeek prefix: true, vLLM continue_final_message) ends the prompt inside the assistant turn', async () => {
  const tokenize = async (body) => (await fetch(srv.url + '/tokenize', {method: 'POST', headers: {'content-type': 'application/json'},
                                                                      body: JSON.stringify(body)})).json();
  const user = {role: 'user', content: 'What is 2+2?'};
  const open = await tokenize({messages: [user]});
  assert.equal(open.tokens.at(-1), kAssistant);  // a new turn, opened
  const prefix = await tokenize({messages: [user, {role: 'assistant', content: 'The answer', prefix: true}]});
  const words = await tokenize({prompt: 'The answer', add_special_tokens: false});
  assert.deepEqual(prefix.tokens, [...open.tokens, ...words.tokens]);  // the turn continues right after its text
  const vllm = await tokenize({messages: [user, {role: 'assistant', content: 'The answer'}], continue_final_message: true,
                               add_generation_prompt: false});
  assert.deepEqual(vllm.tokens, prefix.tokens);
  const r = await fetch(srv.url + '/v1/chat/completions', {method: 'POST', headers: {'content-type': 'application/json'},
    body: JSON.stringify({messages: [user, {role: 'assistant', content: 'The answer', prefix: true}], max_tokens: 4})});
  assert.equal(r.status, 200);
  assert.equal((await r.json()).usage.prompt_tokens, prefix.tokens.length);
  const bad = await fetch(srv.url + '/v1/chat/completions', {method: 'POST', headers: {'content-type': 'application/json'},
    body: JSON.stringify({messages: [{...user, prefix: true}]})});
  assert.equal(bad.status, 400);
  assert.equal((await bad.json()).error.param, 'messages[0].prefix');
});
