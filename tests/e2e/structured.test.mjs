// Structured output through the official openai client, against the demo model (random weights: under a grammar
// every finished output is valid however noisy the model): response_format json_schema (plain and streamed) and
// json_object, vLLM's guided_choice / guided_regex / structured_outputs, and schemas refused by name.
import {test, before, after} from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import {startServer, tmpDir, tokenize, writeTokenizer} from './lib/fathom.mjs';

let srv, client, tokDir;
before(async () => {
  srv = await startServer(['--access-log', 'off']);
  client = new OpenAI({baseURL: srv.url + '/v1', apiKey: 'x', maxRetries: 0});
  tokDir = tmpDir('fathom-structured-');
  writeTokenizer(tokDir);
});
after(async () => { await srv.stop(); });

// Every string, integer and array is bounded, so the grammar ends the output within max_tokens.
const person = {
  type: 'object',
  properties: {
    name: {type: 'string', minLength: 1, maxLength: 12},
    age: {type: 'integer', minimum: 0, maximum: 120},
    role: {enum: ['admin', 'user', 'guest']},
    tags: {type: 'array', items: {type: 'string', maxLength: 5}, maxItems: 3},
    email: {type: 'string', format: 'email', maxLength: 40},
  },
  required: ['name', 'age', 'role', 'tags'],
  additionalProperties: false,
};

function checkPerson(text) {
  const p = JSON.parse(text);
  assert.deepEqual(Object.keys(p).filter((k) => k !== 'email'), ['name', 'age', 'role', 'tags'], text);
  assert.equal(typeof p.name, 'string');
  assert.ok([...p.name].length >= 1 && [...p.name].length <= 12, text);
  assert.ok(Number.isInteger(p.age) && p.age >= 0 && p.age <= 120, text);
  assert.ok(['admin', 'user', 'guest'].includes(p.role), text);
  assert.ok(Array.isArray(p.tags) && p.tags.length <= 3 && p.tags.every((t) => typeof t === 'string' && [...t].length <= 5), text);
  if ('email' in p) assert.match(p.email, /^[^@]+@[^@]+\.[a-zA-Z]{2,6}$/);
}

test('json_schema responses parse and validate, with several seeds', async () => {
  for (const seed of [1, 2, 3, 4]) {
    const r = await client.chat.completions.create({
      model: 'deepseek-v3-demo', messages: [{role: 'user', content: 'Describe a person.'}], max_tokens: 400, seed,
      response_format: {type: 'json_schema', json_schema: {name: 'person', schema: person, strict: true}},
    });
    assert.equal(r.choices[0].finish_reason, 'stop');
    checkPerson(r.choices[0].message.content);
  }
});

test('a streamed json_schema response is valid once its deltas are joined', async () => {
  const stream = await client.chat.completions.create({
    model: 'deepseek-v3-demo', messages: [{role: 'user', content: 'Another.'}], max_tokens: 400, seed: 7, stream: true,
    response_format: {type: 'json_schema', json_schema: {name: 'person', schema: person}},
  });
  let text = '', finish = null;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta?.content ?? '';
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(finish, 'stop');
  checkPerson(text);
});

test('json_object gives a JSON object (the braces biased, so that it is short)', async () => {
  const open = tokenize(tokDir, '{'), close = tokenize(tokDir, '}');
  assert.equal(open.length, 1);
  assert.equal(close.length, 1);
  // '{' first (a biased '}' inside a key string would be text), then '}': the grammar allows nothing else to follow.
  const r = await client.chat.completions.create({
    model: 'deepseek-v3-demo', messages: [{role: 'user', content: 'JSON please'}], max_tokens: 50,
    response_format: {type: 'json_object'}, logit_bias: {[open[0]]: 100, [close[0]]: 100},
  });
  assert.equal(r.choices[0].message.content, '{}');
  assert.equal(r.choices[0].finish_reason, 'stop');
  const v = JSON.parse(r.choices[0].message.content);
  assert.equal(typeof v, 'object');
  assert.ok(!Array.isArray(v) && v !== null);
});

test('guided_choice, guided_regex and structured_outputs (vLLM fields)', async () => {
  for (const seed of [1, 2, 3]) {
    const c = await client.completions.create({model: 'deepseek-v3-demo', prompt: 'Yes or no?', max_tokens: 20, seed,
                                               guided_choice: ['yes', 'no', 'maybe later']});
    assert.ok(['yes', 'no', 'maybe later'].includes(c.choices[0].text), c.choices[0].text);
    const re = await client.completions.create({model: 'deepseek-v3-demo', prompt: 'Code:', max_tokens: 20, seed,
                                                guided_regex: '[A-C]{3}-\\d{2}'});
    assert.match(re.choices[0].text, /^[A-C]{3}-\d{2}$/);
    const so = await client.completions.create({model: 'deepseek-v3-demo', prompt: 'Pick', max_tokens: 10, seed,
                                                structured_outputs: {choice: ['red', 'green']}});
    assert.ok(['red', 'green'].includes(so.choices[0].text), so.choices[0].text);
  }
});

test('guided_grammar (GBNF) and structured_outputs.grammar', async () => {
  const gbnf = 'root ::= "(" item ("," item)* ")"\nitem ::= [a-c] | "n" [0-9]{1,2}\n';
  const close = tokenize(tokDir, ')');
  for (const seed of [1, 2, 3]) {
    const r = await client.completions.create({model: 'deepseek-v3-demo', prompt: 'List:', max_tokens: 40, seed,
                                               guided_grammar: gbnf, logit_bias: {[close[0]]: 10}});
    if (r.choices[0].finish_reason === 'stop') assert.match(r.choices[0].text, /^\((?:[a-c]|n\d{1,2})(?:,(?:[a-c]|n\d{1,2}))*\)$/);
    else assert.match(r.choices[0].text, /^\(/);
  }
  const so = await client.completions.create({model: 'deepseek-v3-demo', prompt: 'x', max_tokens: 8,
                                              structured_outputs: {grammar: 'root ::= "on" | "off"'}});
  assert.ok(['on', 'off'].includes(so.choices[0].text), so.choices[0].text);
});

test('unsupported schemas and bad constraint fields are 400s that name the problem', async () => {
  await assert.rejects(client.chat.completions.create({
    model: 'deepseek-v3-demo', messages: [{role: 'user', content: 'q'}],
    response_format: {type: 'json_schema', json_schema: {name: 'x', schema: {type: 'object', properties: {a: {not: {}}}}}},
  }), (e) => e.status === 400 && e.error.param === 'response_format' && /'not' at '\/properties\/a'/.test(e.error.message));
  await assert.rejects(client.completions.create({model: 'deepseek-v3-demo', prompt: 'x', guided_regex: '(a)\\1'}),
                       (e) => e.status === 400 && e.error.param === 'guided_regex' && /backreferences/.test(e.error.message));
  await assert.rejects(client.completions.create({model: 'deepseek-v3-demo', prompt: 'x', guided_grammar: 'root ::= item\n'}),
                       (e) => e.status === 400 && e.error.param === 'guided_grammar' && /'item' is used/.test(e.error.message));
  await assert.rejects(client.completions.create({model: 'deepseek-v3-demo', prompt: 'x', guided_choice: ['a'],
                                                  guided_regex: 'a'}),
                       (e) => e.status === 400 && /both constrain the output/.test(e.error.message));
  await assert.rejects(client.chat.completions.create({model: 'deepseek-v3-demo', messages: [{role: 'user', content: 'q'}],
                                                       response_format: {type: 'yaml'}}),
                       (e) => e.status === 400 && e.error.param === 'response_format');
  // The server goes on.
  const ok = await client.completions.create({model: 'deepseek-v3-demo', prompt: 'x', max_tokens: 5, guided_choice: ['ok']});
  assert.equal(ok.choices[0].text, 'ok');
});
