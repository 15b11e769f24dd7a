// Tensor parallelism across processes on one machine (CPU ranks, one a process): `mpirun -np 2 fathom serve -tp 2`
// serves the demo's greedy outputs of one rank through the openai client; a rank process that dies ends the job
// (mpirun stops the others and says which); a rank process that stops answering ends the job after the collective
// timeout, with the reason, instead of hanging it.
import assert from 'node:assert/strict';
import {after, before, test} from 'node:test';
import OpenAI from 'openai';

import path from 'node:path';
import {fileURLToPath} from 'node:url';

import {greedyDemo, startServer} from './lib/fathom.mjs';

const mpirun = ['mpirun', '-np', '2', '--oversubscribe'];
// CI runs as root; Open MPI refuses that unless told. Under ASan, Open MPI's own allocations are not reported as
// fathom's leaks: the suppressions name its libraries, which the slow unwinder can see in an allocation's stack
// (Open MPI is built without frame pointers, so the fast one stops at an unknown frame).
const supp = path.join(path.dirname(fileURLToPath(import.meta.url)), 'lsan_openmpi.supp');
const mpiEnv = {OMPI_ALLOW_RUN_AS_ROOT: '1', OMPI_ALLOW_RUN_AS_ROOT_CONFIRM: '1', OMPI_MCA_btl: 'self,tcp,vader',
                ASAN_OPTIONS: [process.env.ASAN_OPTIONS, 'fast_unwind_on_malloc=0'].filter(Boolean).join(':'),
                LSAN_OPTIONS: `suppressions=${supp}:print_suppressions=0`};
const prompts = ['Hello', 'def fib(n):', 'The capital of France is', '1, 2, 3,'];

const greedy = (srv) => greedyDemo(srv, prompts, 10);

// The pid of process `rank` of a multi-process server (its startup line).
function pidOf(srv, rank) {
  const m = srv.stderr.match(new RegExp(`process ${rank} \\(pid (\\d+)\\) holds ranks`));
  assert.ok(m, srv.stderr);
  return Number(m[1]);
}

async function exitWithin(srv, ms) {
  let timer;
  const late = new Promise((resolve) => {
    timer = setTimeout(() => resolve('still running'), ms);
  });
  const code = await Promise.race([srv.exited, late]);
  clearTimeout(timer);
  if (code === 'still running') srv.child.kill('SIGKILL');
  return code;
}

let one;
before(async () => {
  one = await startServer(['--max-model-len', '512']);
});
after(async () => {
  assert.equal(await one.stop(), 0, one.stderr);
});

test('two processes give the greedy outputs of one, alone and batched, and stop cleanly', async () => {
  const two = await startServer(['-tp', '2', '--max-model-len', '512'], {launcher: mpirun, env: mpiEnv});
  assert.match(two.stderr, /tensor parallel: 2 ranks over 2 processes/);
  const want = await greedy(one);
  const got = await greedy(two);
  assert.ok(want.alone.every((t) => t.length > 0));
  assert.deepEqual(got.alone, want.alone);
  assert.deepEqual(got.batched, want.alone);
  // SIGTERM to process 0 (the server): it drains, then stops process 1; mpirun exits 0.
  process.kill(pidOf(two, 0), 'SIGTERM');
  assert.equal(await exitWithin(two, 60000), 0, two.stderr);
  assert.match(two.stderr, /tensor-parallel process 1: process 0 stopped; exiting/);
});

// Starts `mpirun -np 2 fathom serve -tp 2`, sends `signal` to rank process 1, asks for a completion (which cannot
// finish), and waits up to 60 s for the job to end. Returns the launcher's exit code ('still running' if it hung,
// after killing it) and its stderr.
async function signalRankOne(signal, env) {
  const two = await startServer(['-tp', '2', '--max-model-len', '512'], {launcher: mpirun, env});
  process.kill(pidOf(two, 1), signal);
  const client = new OpenAI({baseURL: two.url + '/v1', apiKey: 'x', maxRetries: 0, timeout: 60000});
  await client.completions.create({model: 'deepseek-v3-demo', prompt: 'Hello', max_tokens: 4}).catch(() => {});
  return {code: await exitWithin(two, 60000), stderr: two.stderr};
}

test('a rank process that dies ends the job, and mpirun names it', async () => {
  const {code, stderr} = await signalRankOne('SIGKILL', mpiEnv);
  assert.notEqual(code, 'still running', 'the job hung after a rank died:\n' + stderr);
  assert.notEqual(code, 0, stderr);
  assert.match(stderr, /exited on signal 9|killed|terminated/i);
});

test('a rank process that stops answering ends the job after the collective timeout', async () => {
  const {code, stderr} = await signalRankOne('SIGSTOP', {...mpiEnv, FATHOM_COLLECTIVE_TIMEOUT_S: '3'});
  assert.notEqual(code, 'still running', 'the job hung on a stopped rank:\n' + stderr);
  assert.notEqual(code, 0, stderr);
  assert.match(stderr, /waited 3 s at .* for a peer process that did not come/);
});
