// Client libraries exactly as their documentation shows them, against one `fathom serve` of the scripted test model
// (lib/fathom.mjs), pinned in package.json: the official `openai` SDK 7 (create, stream, parse with zodResponseFormat,
// runTools), the Vercel AI SDK 7 (@ai-sdk/deepseek at DeepSeek's URL forms without /v1 and with /beta,
// @ai-sdk/openai-compatible and @ai-sdk/openai's chat models at /v1) and LangChain JS (ChatOpenAI, ChatDeepSeek). The schemas are zod's own output (z.toJSONSchema and the libraries'
// converters), never copied by hand. Under a grammar the scripted model's text is whatever the constraint lets through,
// so structured cases check validity and shape, not values: that is what random weights explain.
import {test, before, after} from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import OpenAI from 'openai';
import {zodResponseFormat} from 'openai/helpers/zod';
import {generateText, streamText, Output, tool, stepCountIs} from 'ai';
import {createDeepSeek} from '@ai-sdk/deepseek';
import {createOpenAI} from '@ai-sdk/openai';
import {createOpenAICompatible} from '@ai-sdk/openai-compatible';
import {ChatOpenAI} from '@langchain/openai';
import {ChatDeepSeek} from '@langchain/deepseek';
import {z} from 'zod';
import {buildScriptedModel, startServer, tmpDir} from './lib/fathom.mjs';

const kAssistant = 128804;  // <｜Assistant｜>: every chat prompt of the DeepSeek-V3 template ends with it
const kKey = 'sk-sdk-0123456789';
let srv, openai;

before(async () => {
  const model = buildScriptedModel(path.join(tmpDir('fathom-e2e-'), 'model'), [
    {triggerId: kAssistant, text: 'Let me think.</think>The answer is 4.', end: 'eos'},
    {trigger: 'Count:', text: ' one two three', end: 'eos'},
  ]);
  srv = await startServer(['--model', model.dir, '--served-model-name', 'deepseek-chat', 'deepseek-reasoner',
                           '--reasoning-parser', 'deepseek-r1', '--max-model-len', '1024', '--api-key', kKey,
                           '--access-log', 'off']);
  openai = new OpenAI({baseURL: srv.url + '/v1', apiKey: kKey, maxRetries: 0});
});

after(async () => {
  assert.equal(await srv.stop(), 0, srv.stderr);
});

const question = [{role: 'user', content: 'What is 2+2?'}];
// zod's common types, bounded so that the grammar ends the output: z.int() is the field zod writes as
// minimum -(2^53 - 1), maximum 2^53 - 1.
const Answer = z.object({
  value: z.int(),
  unit: z.enum(['apples', 'pears']).nullable(),
  note: z.string().max(12),
});

test('openai 7: create, stream, parse with zodResponseFormat', async () => {
  const r = await openai.chat.completions.create({model: 'deepseek-chat', messages: question});
  assert.equal(r.choices[0].message.content, 'The answer is 4.');
  assert.equal(r.choices[0].message.reasoning_content, 'Let me think.');

  const stream = openai.chat.completions.stream({model: 'deepseek-chat', messages: question});
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  assert.equal(text, 'The answer is 4.');
  assert.equal((await stream.finalChatCompletion()).choices[0].message.content, 'The answer is 4.');

  const parsed = await openai.chat.completions.parse({
    model: 'deepseek-chat', messages: question, max_tokens: 200, response_format: zodResponseFormat(Answer, 'answer'),
  });
  const p = parsed.choices[0].message.parsed;
  assert.ok(p !== null, parsed.choices[0].message.content);
  assert.ok(Number.isSafeInteger(p.value), JSON.stringify(p));
});

// zod writes a pattern beside the format for z.email(), z.uuid(), z.iso.date() and z.iso.datetime(): the output must
// meet both (parse() checks it with the zod schema itself). The datetime has millisecond precision: the default's
// pattern allows any number of fraction digits, which random weights may extend to max_tokens.
test('openai 7: parse with zod formats that carry their own patterns', async () => {
  const Contact = z.object({email: z.email().max(40), id: z.uuid(), day: z.iso.date(),
                            at: z.iso.datetime({precision: 3})});
  const r = await openai.chat.completions.parse({
    model: 'deepseek-chat', messages: [{role: 'user', content: 'Who?'}], max_tokens: 300,
    response_format: zodResponseFormat(Contact, 'contact'),
  });
  assert.equal(r.choices[0].finish_reason, 'stop');
  const c = r.choices[0].message.parsed;
  assert.ok(c !== null && Contact.safeParse(c).success, r.choices[0].message.content);
});

test('openai 7: runTools runs a forced call and answers from its result', async () => {
  let called = null;
  // max_tokens leaves room for a random model that spells the call's markers in pieces rather than as their tokens.
  const runner = openai.chat.completions.runTools({
    model: 'deepseek-chat', messages: question, max_tokens: 200,
    tool_choice: {type: 'function', function: {name: 'add'}},
    tools: [{type: 'function', function: {
      name: 'add', description: 'Adds two small numbers',
      parameters: z.toJSONSchema(z.object({a: z.int().min(0).max(9), b: z.int().min(0).max(9)})),
      parse: JSON.parse, function: (args) => { called = args; return String(args.a + args.b); },
    }}],
  }, {maxChatCompletions: 2});
  const final = await runner.finalChatCompletion().catch((e) => e);
  // The forced first call is valid (the grammar makes it so); the second turn is the model's own.
  assert.ok(called !== null && Number.isInteger(called.a) && Number.isInteger(called.b), String(final));
});

test('AI SDK 7 with @ai-sdk/deepseek at the base URL without /v1: text, stream, reasoning, object', async () => {
  const deepseek = createDeepSeek({baseURL: srv.url, apiKey: kKey});
  const r = await generateText({model: deepseek('deepseek-reasoner'), prompt: 'What is 2+2?', maxRetries: 0});
  assert.equal(r.text, 'The answer is 4.');
  assert.equal(r.reasoningText, 'Let me think.');
  const s = streamText({model: deepseek('deepseek-chat'), prompt: 'What is 2+2?', maxRetries: 0});
  let streamed = '';
  for await (const delta of s.textStream) streamed += delta;
  assert.equal(streamed, 'The answer is 4.');
  // @ai-sdk/deepseek asks for DeepSeek's json_object and puts the schema in the system message, as DeepSeek's API
  // takes no json_schema: the server guarantees a JSON object, and only a trained model follows the schema in the
  // prompt. With random weights the object does not match the schema (random weights explain that), so this case
  // checks what the server owes: the text is one JSON object, or its start where maxOutputTokens cut it.
  await assert.rejects(
      generateText({model: deepseek('deepseek-chat'), prompt: 'What is 2+2?', maxRetries: 0, maxOutputTokens: 200,
                    output: Output.object({schema: Answer})}),
      (e) => {
        assert.equal(e.name, 'AI_NoObjectGeneratedError');
        // json_object bounds nothing: a random object may run past maxOutputTokens, cut (finish "length").
        if (e.finishReason === 'length') return e.text.startsWith('{');
        const v = JSON.parse(e.text);
        return v !== null && typeof v === 'object' && !Array.isArray(v);
      });
});

test("AI SDK 7 with @ai-sdk/deepseek at DeepSeek's /beta base URL: prefix completion", async () => {
  // The provider sends `prefix: true` only with a base URL ending in /beta, as DeepSeek documents it.
  const beta = createDeepSeek({baseURL: srv.url + '/beta', apiKey: kKey});
  const r = await generateText({model: beta('deepseek-chat'), maxRetries: 0, messages: [
    {role: 'user', content: 'Count:'},
    {role: 'assistant', content: 'Count:', providerOptions: {deepseek: {prefix: true}}},
  ]});
  assert.equal(r.text, ' one two three');
});

test('AI SDK 7 with @ai-sdk/openai-compatible: structured output and a required tool call', async () => {
  const local = createOpenAICompatible({name: 'fathom', baseURL: srv.url + '/v1', apiKey: kKey,
                                         supportsStructuredOutputs: true});
  const o = await generateText({model: local('deepseek-chat'), prompt: 'What is 2+2?', maxRetries: 0,
                                maxOutputTokens: 200, output: Output.object({schema: Answer})});
  assert.ok(['apples', 'pears', null].includes(o.output.unit), JSON.stringify(o.output));
  // z.record(z.string(), ...) writes propertyNames (here with maxLength): keys and values are held to them.
  const Scores = z.object({scores: z.record(z.string().max(3), z.int().min(0).max(9))});
  const rec = await generateText({model: local('deepseek-chat'), prompt: 'Scores?', maxRetries: 0, maxOutputTokens: 300,
                                  output: Output.object({schema: Scores})});
  assert.ok(Scores.safeParse(rec.output).success, JSON.stringify(rec.output));
  let args = null;
  const t = await generateText({
    model: local('deepseek-chat'), prompt: 'Add 2 and 2.', maxRetries: 0, maxOutputTokens: 200,
    // Named, not 'required': the grammar then ends after one call of it (with 'required' the random model may call
    // on until max tokens cut a call mid-arguments, which the SDK refuses to run: a flake seen in cold CI runs).
    toolChoice: {type: 'tool', toolName: 'add'}, stopWhen: stepCountIs(1),
    tools: {add: tool({description: 'Adds two small numbers',
                       inputSchema: z.object({a: z.int().min(0).max(9), b: z.int().min(0).max(9)}),
                       execute: async (input) => { args = input; return input.a + input.b; }})},
  });
  assert.equal(t.toolCalls.length >= 1, true, JSON.stringify(t.finishReason));
  assert.ok(args !== null && Number.isInteger(args.a), JSON.stringify(args));
});

// @ai-sdk/openai's chat models (openai.chat(id)) speak Chat Completions; its default models speak OpenAI's Responses
// API, which fathom does not serve (a 404 naming the route).
test('AI SDK 7 with @ai-sdk/openai: chat models, text and stream', async () => {
  const provider = createOpenAI({baseURL: srv.url + '/v1', apiKey: kKey});
  const r = await generateText({model: provider.chat('deepseek-chat'), prompt: 'What is 2+2?', maxRetries: 0});
  assert.equal(r.text, 'The answer is 4.');
  const s = streamText({model: provider.chat('deepseek-chat'), prompt: 'What is 2+2?', maxRetries: 0});
  let streamed = '';
  for await (const delta of s.textStream) streamed += delta;
  assert.equal(streamed, 'The answer is 4.');
});

test('LangChain ChatOpenAI and ChatDeepSeek: invoke, stream, withStructuredOutput', async () => {
  const llm = new ChatOpenAI({model: 'deepseek-chat', apiKey: kKey, maxRetries: 0,
                              configuration: {baseURL: srv.url + '/v1'}});
  assert.equal((await llm.invoke('What is 2+2?')).content, 'The answer is 4.');
  let streamed = '';
  for await (const chunk of await llm.stream('What is 2+2?')) streamed += chunk.content;
  assert.equal(streamed, 'The answer is 4.');
  for (const method of ['jsonSchema', 'functionCalling']) {
    const structured = new ChatOpenAI({model: 'deepseek-chat', apiKey: kKey, maxRetries: 0, maxTokens: 200,
                                       configuration: {baseURL: srv.url + '/v1'}})
        .withStructuredOutput(Answer, {name: 'answer', method});
    const a = await structured.invoke('What is 2+2?');
    assert.ok(Number.isSafeInteger(a.value), `${method}: ${JSON.stringify(a)}`);
  }
  const ds = new ChatDeepSeek({model: 'deepseek-reasoner', apiKey: kKey, maxRetries: 0,
                               configuration: {baseURL: srv.url}});
  const m = await ds.invoke('What is 2+2?');
  assert.equal(m.content, 'The answer is 4.');
  assert.equal(m.additional_kwargs.reasoning_content, 'Let me think.');
});
