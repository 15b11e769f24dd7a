// Tool calls through the official openai client, against the demo model (DeepSeek-V3's template and tokenizer, random
// weights): tool_choice required and named (a grammar of calls in DeepSeek's format, so every call is valid however
// noisy the model), auto (the model's text parsed; a guided_regex plays the model that calls a tool), streamed and
// not, parallel_tool_calls, the history of calls rendered back, and the errors. DeepSeek-V3.2's and V4's DSML on
// checkpoints of their own: dsml.test.mjs.
import {test, before, after} from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import {startServer} from './lib/fathom.mjs';
import {checkCall, collect, messages, tools} from './lib/tool_calls.mjs';

let srv, client;
before(async () => {
  srv = await startServer(['--access-log', 'off']);
  client = new OpenAI({baseURL: srv.url + '/v1', apiKey: 'x', maxRetries: 0});
});
after(async () => { await srv.stop(); });


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
