// Replicas on one host: two `fathom serve --reuse-port` processes sharing one port (the kernel spreads connections;
// one drains under load and no request fails), and one process with `--data-parallel-size 2` (prefix placement
// beats round-robin's prefix-cache hit ratio by 2x or more on a shared-prefix workload, the outputs are a single
// replica's, metrics and timings name the replica, and a resumable stream resumes whichever replica made it).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import {after, before, test} from 'node:test';
import path from 'node:path';

import {buildScriptedModel, freePort, freePorts, readSse, scrape, sleep, startServer, tmpDir} from './lib/fathom.mjs';

let model;
before(async () => {
  model = buildScriptedModel(path.join(tmpDir('fathom-replicas-'), 'm'), [
    {trigger: 'Count:', text: ' one two three four five six seven eight', end: 'eos'},
    {trigger: 'Loop', text: ' la', end: 'cycle'},
  ]);
});

// One POST on a connection of its own (no keep-alive pool): each request is a new connection, which the kernel
// places on one of the processes sharing the port. Resolves with {status, body}; rejects on a connection error.
function post(port, route, body) {
  return new Promise((resolve, reject) => {
    const data = JSON.stringify(body);
    const req = http.request({host: '127.0.0.1', port, path: route, method: 'POST', agent: false,
                              headers: {'content-type': 'application/json', 'content-length': Buffer.byteLength(data),
                                        connection: 'close'}}, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d) => (text += d));
      res.on('end', () => resolve({status: res.statusCode, body: text}));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(data);
  });
}

// Whether this network namespace migrates a closing --reuse-port listener's queued connections to another
// (net.ipv4.tcp_migrate_req, Linux 5.14+; docs/DEPLOYMENT.md). Without it, a connection that the kernel queues on
// the draining process's listener in the instant between the server taking its queue and closing it is reset before
// the server ever sees it: a connect-time reset, which clients retry (the openai client does).
const migratesQueuedConnections = (() => {
  try {
    return fs.readFileSync('/proc/sys/net/ipv4/tcp_migrate_req', 'utf8').trim() === '1';
  } catch {
    return false;
  }
})();

// One completion; a connect-time reset is retried once (see migratesQueuedConnections), calling onRetry. Resolves
// with {status, body}, or {status: 0, error} on any other failure.
async function completionRetryingConnect(port, body, onRetry = () => {}) {
  for (let attempt = 0; ; ++attempt) {
    try {
      return await post(port, '/v1/completions', body);
    } catch (e) {
      if (!migratesQueuedConnections && attempt === 0 && e.code === 'ECONNRESET' && e.syscall === 'connect') {
        onRetry();
        continue;
      }
      return {status: 0, error: String(e)};
    }
  }
}

// `total` completions, `concurrency` at a time; `onDone(i)` after each. Every outcome is kept, failures included.
// load.connectRetries counts the connect-time resets retried (only where the kernel does not migrate them).
async function load(port, total, concurrency, body, onDone = () => {}) {
  const results = [];
  let next = 0;
  load.connectRetries = 0;
  const worker = async () => {
    while (next < total) {
      const i = next++;
      results[i] = await completionRetryingConnect(port, body, () => ++load.connectRetries);
      onDone(i);
    }
  };
  await Promise.all(Array.from({length: concurrency}, worker));
  return results;
}

const generations = (srv) => srv.access.filter((l) => l.path === '/v1/completions');

test('two --reuse-port processes share one port: 200 requests all succeed and both serve some', async () => {
  const [port, pa, pb] = await freePorts(3);
  const a = await startServer(['--model', model.dir, '--reuse-port', '--private-port', String(pa)], {port});
  let b = null;
  try {
    b = await startServer(['--model', model.dir, '--reuse-port', '--private-port', String(pb)], {port});
    const results = await load(port, 200, 16, {prompt: 'Count:', max_tokens: 3});
    const bad = results.filter((r) => r.status !== 200);
    assert.equal(bad.length, 0, JSON.stringify(bad.slice(0, 3)));
    for (const r of results) assert.equal(JSON.parse(r.body).choices[0].text, ' one two three');
    const na = generations(a).length, nb = generations(b).length;
    assert.equal(na + nb, 200);
    assert.ok(na > 0 && nb > 0, `a served ${na}, b served ${nb}`);
    console.log(`reuse-port: a served ${na}, b served ${nb}`);
    // Each process's own metrics, on its private port.
    const count = (m) => Object.entries(m).filter(([k]) => k.startsWith('fathom_requests_total{'))
        .reduce((x, [, v]) => x + v, 0);
    assert.equal(count(await scrape(`http://127.0.0.1:${pa}`)), na);
    assert.equal(count(await scrape(`http://127.0.0.1:${pb}`)), nb);
  } finally {
    await a.stop();
    if (b) await b.stop();
  }
});

test('SIGTERM to one of two --reuse-port processes under load: no request fails, the other takes the new ones', async () => {
  const port = await freePort();
  const a = await startServer(['--model', model.dir, '--reuse-port', '--shutdown-grace-s', '30'], {port});
  let b = null;
  try {
    b = await startServer(['--model', model.dir, '--reuse-port'], {port});
    let done = 0, signalled = false, aBefore = 0;
    // 8 tokens each, 16 at a time, so that requests are in flight on both processes when the signal comes.
    const total = 60, signalAt = 20, tokens = 8;
    const results = await load(port, total, 16, {prompt: 'Loop', max_tokens: tokens, ignore_eos: true}, () => {
      if (++done === signalAt && !signalled) {
        signalled = true;
        aBefore = generations(a).length;
        a.child.kill('SIGTERM');
      }
    });
    const bad = results.filter((r) => r.status !== 200);
    assert.equal(bad.length, 0, `${bad.length} failed: ${JSON.stringify(bad.slice(0, 3))}`);
    for (const r of results) assert.equal(JSON.parse(r.body).usage.completion_tokens, tokens);
    // The kernel's gap is an instant: at most a couple of connections can land in it.
    assert.ok(load.connectRetries <= 2, `${load.connectRetries} connect-time resets`);
    if (load.connectRetries > 0) console.log(`connect-time resets retried: ${load.connectRetries}`);
    assert.equal(await a.exited, 0, a.stderr);
    assert.match(a.stderr, /SIGTERM: draining/);
    const na = generations(a).length, nb = generations(b).length;
    assert.equal(na + nb, total);
    assert.ok(aBefore > 0, 'a served nothing before the signal');
    // After its drain began, a finished what it held (at most the 16 in flight); the rest went to b.
    assert.ok(na <= aBefore + 16 && nb >= total - signalAt - 16, `a served ${na}, b served ${nb}`);
    console.log(`drain: a served ${na} (${aBefore} done before SIGTERM), b served ${nb}`);
    // b is unaffected and serves on.
    const after = await post(port, '/v1/completions', {prompt: 'Count:', max_tokens: 8});
    assert.equal(after.status, 200);
  } finally {
    await a.stop();
    if (b) await b.stop();
  }
});

test('a rolling restart under load: the new --reuse-port process takes connections only once ready, none fail', async () => {
  const port = await freePort();
  const a = await startServer(['--model', model.dir, '--reuse-port', '--shutdown-grace-s', '30'], {port});
  let b = null;
  try {
    let stop = false;
    const body = {prompt: 'Count:', max_tokens: 4};
    const results = [];
    const workers = Array.from({length: 6}, async () => {
      while (!stop) results.push(await completionRetryingConnect(port, body));
    });
    await sleep(200);
    // b loads while the load runs: a process that listened before it was ready answered its share 503 "loading".
    b = await startServer(['--model', model.dir, '--reuse-port'], {port});
    assert.match(b.stderr, /port \d+ is shared \(--reuse-port\), so it is bound once ready/);
    await sleep(300);
    a.child.kill('SIGTERM');
    assert.equal(await a.exited, 0, a.stderr);
    await sleep(300);
    stop = true;
    await Promise.all(workers);
    const bad = results.filter((r) => r.status !== 200);
    assert.equal(bad.length, 0, `${bad.length} of ${results.length} failed: ${JSON.stringify(bad.slice(0, 3))}`);
    assert.ok(generations(b).length > 0, 'b served nothing');
    console.log(`rolling restart: ${results.length} requests, a served ${generations(a).length}, b ${generations(b).length}`);
  } finally {
    await a.stop();
    if (b) await b.stop();
  }
});

test('--reuse-port needs a fixed port, and --data-parallel-size and --placement-policy check their values', async () => {
  const {spawnSync} = await import('node:child_process');
  const {fathomBin} = await import('./lib/fathom.mjs');
  const run = (args) => spawnSync(fathomBin, ['serve', '--model', model.dir, ...args], {encoding: 'utf8'});
  const cases = [
    [['--port', '0', '--reuse-port'], /--reuse-port shares one fixed port/],
    [['--port', '8123', '--private-port', '8123'], /--private-port must differ from --port/],
    [['--data-parallel-size', '0'], /--data-parallel-size must be in \[1, 64\]/],
    [['--placement-policy', 'random'], /--placement-policy 'random' is not known/],
    [['--data-parallel-size', '2', '--device', 'cpu,cpu,cpu'], /--device lists 3 devices for --data-parallel-size 2/],
  ];
  for (const [args, message] of cases) {
    const r = run(args);
    assert.notEqual(r.status, 0, args.join(' '));
    assert.match(r.stderr, message);
  }
});

// 6 system prompts of 64 token ids (4 blocks of 16), 4 rounds in a shuffled order, each request with its own 9-id
// question; 16 KV blocks per replica hold 3 such prompts. Round-robin spreads every prompt over both replicas,
// which evict each other's; prefix placement keeps each prompt on one replica.
function sharedPrefixWorkload() {
  let seed = 7;
  const rand = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
  const ids = (n) => Array.from({length: n}, () => 1000 + Math.floor(rand() * 50000));
  const systems = Array.from({length: 6}, () => ids(64));
  const prompts = [];
  for (let round = 0; round < 4; ++round) {
    const order = [0, 1, 2, 3, 4, 5];
    for (let i = order.length - 1; i > 0; --i) {
      const j = Math.floor(rand() * (i + 1));
      [order[i], order[j]] = [order[j], order[i]];
    }
    for (const s of order) prompts.push([...systems[s], ...ids(9)]);
  }
  return prompts;
}

async function runWorkload(args) {
  // The built-in demo (random weights, the same seed in every replica), so that outputs depend on the whole prompt.
  const srv = await startServer(['--num-kv-blocks', '16', '--max-model-len', '256', '--access-log', '-', ...args]);
  try {
    const texts = [];
    for (const prompt of sharedPrefixWorkload()) {
      const r = await fetch(srv.url + '/v1/completions', {
        method: 'POST', headers: {'content-type': 'application/json'},
        body: JSON.stringify({model: 'deepseek-v3-demo', prompt, max_tokens: 4, temperature: 0, ignore_eos: true})});
      assert.equal(r.status, 200);
      texts.push((await r.json()).choices[0].text);
    }
    await sleep(200);  // the last step's counters
    const m = await scrape(srv.url);
    const sum = (name) => Object.entries(m).filter(([k]) => k.startsWith(name + '{') || k === name)
        .reduce((a, [, v]) => a + v, 0);
    const ratio = sum('fathom_prefix_cache_hit_tokens_total') / sum('fathom_prefix_cache_queries_tokens_total');
    return {texts, ratio, metrics: m, access: srv.access.filter((l) => l.path === '/v1/completions')};
  } finally {
    await srv.stop();
  }
}

// Behind the HTTP front: the hit ratio against round-robin's and the outputs against one engine's are the unit
// test's (EngineGroupTest.PrefixPlacementDoublesTheHitRatioOfRoundRobinWithTheSameOutputs); here, one server with
// two replicas places by prefix, and its metrics and timings name the replicas.
test('--data-parallel-size 2: prefix placement behind one front keeps the hit ratio, and metrics and timings name the replica', async () => {
  const prefix = await runWorkload(['--data-parallel-size', '2']);  // prefix is the default
  console.log(`hit ratio: prefix placement over 2 replicas ${prefix.ratio.toFixed(3)}`);
  assert.ok(prefix.ratio > 0.5, `prefix ratio ${prefix.ratio}`);
  // Metrics name each replica and its device; requests are counted by replica and placement.
  const m = prefix.metrics;
  assert.equal(m['fathom_replica_info{replica="0",device="cpu",policy="prefix"}'], 1);
  assert.equal(m['fathom_replica_info{replica="1",device="cpu",policy="prefix"}'], 1);
  assert.ok('fathom_kv_cache_usage_ratio{replica="1",device="cpu"}' in m);
  assert.ok(m['fathom_kv_cache_hit_ratio{replica="0",device="cpu"}'] > 0);
  const placed = (replica, placement) => m[`fathom_replica_requests_total{replica="${replica}",placement="${placement}"}`] || 0;
  assert.equal(placed(0, 'prefix') + placed(1, 'prefix') + placed(0, 'least_loaded') + placed(1, 'least_loaded'), 24);
  assert.equal(placed(0, 'prefix') + placed(1, 'prefix'), 18);  // every request after the first round
  // The access log's timing names the replica.
  assert.deepEqual([...new Set(prefix.access.map((l) => l.timing.replica))].sort(), [0, 1]);
});

test('--data-parallel-size 2: each replica\'s resumable stream resumes, and timings name the replica', async () => {
  const srv = await startServer(['--model', model.dir, '--data-parallel-size', '2', '--placement-policy', 'round-robin']);
  try {
    const replicas = new Set();
    for (let i = 0; i < 2; ++i) {
      const body = {prompt: 'Loop', max_tokens: 30, ignore_eos: true, stream: true,
                    stream_options: {resumable: true, include_usage: true}};
      const controller = new AbortController();
      const r = await fetch(srv.url + '/v1/completions', {method: 'POST', signal: controller.signal,
                                                         headers: {'content-type': 'application/json'},
                                                         body: JSON.stringify(body)});
      const id = r.headers.get('x-fathom-stream-id');
      let got = [];
      try {
        await readSse(r, {onEvent: (e, all) => {
          got = all;
          if (all.length === 3) controller.abort();
        }});
      } catch {}
      const resumed = await fetch(srv.url + `/v1/streams/${id}`, {headers: {'last-event-id': String(got.at(-1).id)}});
      assert.equal(resumed.status, 200);
      const rest = await readSse(resumed);
      assert.equal(rest.at(-1).data, '[DONE]');
      const chunks = [...got, ...rest].filter((e) => e.data !== '[DONE]').map((e) => JSON.parse(e.data));
      const text = chunks.filter((c) => c.choices.length > 0).map((c) => c.choices[0].text).join('');
      assert.equal(text, ' la'.repeat(30));
      const usage = chunks.find((c) => c.fathom_timing);
      assert.ok(usage, 'a usage chunk with fathom_timing');
      replicas.add(usage.fathom_timing.replica);
    }
    assert.deepEqual([...replicas].sort(), [0, 1]);
    // A non-streamed response says the replica in its timing header.
    const r = await fetch(srv.url + '/v1/completions', {method: 'POST', headers: {'content-type': 'application/json'},
                                                       body: JSON.stringify({prompt: 'Count:', max_tokens: 8})});
    assert.match(r.headers.get('x-fathom-timing'), /;replica=[01]$/);
  } finally {
    await srv.stop();
  }
});
