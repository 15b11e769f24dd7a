// Tensor parallelism on the CPU: `fathom serve --tensor-parallel-size 2` (and vLLM's -tp) on the built-in demo
// (DeepSeek-V3 architecture: MLA and MoE split over two ranks, threads of one process) serves through the openai
// client, and its greedy outputs, alone, batched and streamed, are those of one rank; so are those of two ranks with
// expert parallelism (--enable-expert-parallel: each rank runs half of the routed experts, whole); a split the model
// does not allow ends the server at startup with the dimension named.
import assert from 'node:assert/strict';
import {spawnSync} from 'node:child_process';
import {after, before, test} from 'node:test';

import {fathomBin, greedyDemo, startServer} from './lib/fathom.mjs';

const prompts = ['Hello', 'def fib(n):', 'The capital of France is', '1, 2, 3,', 'Once upon a time', '{"a":'];
let one, two, ep;

const greedy = (srv) => greedyDemo(srv, prompts, 12, {chat: true});

before(async () => {
  one = await startServer(['--max-model-len', '512']);
  two = await startServer(['-tp', '2', '--max-model-len', '512']);
  ep = await startServer(['-tp', '2', '--enable-expert-parallel', '--max-model-len', '512']);
});

after(async () => {
  assert.equal(await one.stop(), 0, one.stderr);
  assert.equal(await two.stop(), 0, two.stderr);
  assert.equal(await ep.stop(), 0, ep.stderr);
});

test('two ranks give the greedy outputs of one, alone, batched and streamed', async () => {
  assert.match(two.stderr, /tensor parallel: 2 ranks on the CPU/);
  const want = await greedy(one);
  const got = await greedy(two);
  assert.ok(want.alone.every((t) => t.length > 0));
  assert.deepEqual(got.alone, want.alone);
  assert.deepEqual(got.batched, want.alone);
  assert.equal(got.chat, want.chat);
  assert.match(ep.stderr, /expert parallel: \d+ routed experts a rank/);
  const gotEp = await greedy(ep);
  assert.deepEqual(gotEp.alone, want.alone);
  assert.deepEqual(gotEp.batched, want.alone);
  assert.equal(gotEp.chat, want.chat);
});

test('a split the model does not allow ends the server at startup, naming the dimension', () => {
  const r = spawnSync(fathomBin, ['serve', '--port', '0', '--tensor-parallel-size', '3'], {encoding: 'utf8',
                                                                                       timeout: 120000});
  assert.notEqual(r.status, 0, r.stderr);
  assert.match(r.stderr, /does not split into 3 tensor-parallel/);
});
