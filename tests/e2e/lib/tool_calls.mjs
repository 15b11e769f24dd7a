// What the tool-call suites share (tools.test.mjs on the demo model, dsml.test.mjs on DeepSeek-V3.2 and V4
// checkpoints): the tools, the question, the check of a call against its tool's schema, and a client's join of
// streamed tool-call deltas.
import assert from 'node:assert/strict';

export const tools = [
  {type: 'function', function: {name: 'get_weather', description: 'Current weather of a city',
    parameters: {type: 'object', properties: {city: {type: 'string', maxLength: 10}, unit: {enum: ['c', 'f']}},
                 required: ['city', 'unit'], additionalProperties: false}}},
  {type: 'function', function: {name: 'get_time', description: 'Time of a zone',
    parameters: {type: 'object', properties: {zone: {enum: ['UTC', 'CET']}}, required: ['zone'],
                 additionalProperties: false}}},
];
export const messages = [{role: 'user', content: 'What is the weather in Paris?'}];

export function checkCall(call) {
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
export async function collect(stream) {
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
