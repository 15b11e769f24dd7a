// Observability end to end: a real Prometheus (Debian's package) scrapes a running `fathom serve` every second;
// after known traffic its HTTP API must show the TTFT histogram count and the token counters up by exactly the
// amounts sent. The Grafana dashboard must query only metric names that the live /metrics exposes. A trace window
// from POST /debug/trace must hold engine steps and request spans.
import {test, before, after} from 'node:test';
import assert from 'node:assert/strict';
import {spawn, execFileSync} from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import {buildScriptedModel, repoRoot, sleep, startServer, tmpDir} from './lib/fathom.mjs';

const kAssistant = 128804;
let srv, prom, promUrl, work;

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => {
      const {port} = s.address();
      s.close(() => resolve(port));
    });
  });
}

async function promQuery(q) {
  const r = await fetch(`${promUrl}/api/v1/query?query=${encodeURIComponent(q)}`);
  const body = await r.json();
  assert.equal(body.status, 'success', JSON.stringify(body));
  return body.data.result.length ? Number(body.data.result[0].value[1]) : NaN;
}

async function waitFor(q, pred, timeoutMs = 30000) {
  const deadline = Date.now() + timeoutMs;
  let v;
  for (;;) {
    try {
      v = await promQuery(q);
    } catch (e) {
      v = `unreachable (${e.cause ? e.cause.code : e.message})`;  // Prometheus still starting
    }
    if (pred(v)) return v;
    if (Date.now() > deadline) throw new Error(`${q} = ${v}; Prometheus log:\n${prom.log.slice(-2000)}`);
    await sleep(250);
  }
}

before(async () => {
  work = tmpDir('fathom-obs-');
  const model = buildScriptedModel(path.join(work, 'model'), [
    {triggerId: kAssistant, text: 'The answer is 4.', end: 'eos'},
    {trigger: 'Count:', text: ' one two three four five six seven eight nine ten', end: 'eos'},
  ]);
  srv = await startServer(['--model', model.dir, '--served-model-name', 'scripted', '--access-log', 'off']);
  const port = await freePort();
  promUrl = `http://127.0.0.1:${port}`;
  fs.writeFileSync(path.join(work, 'prometheus.yml'), [
    'global: {scrape_interval: 1s, evaluation_interval: 1s}',
    'scrape_configs:',
    '  - job_name: fathom',
    `    static_configs: [{targets: ['127.0.0.1:${srv.port}']}]`,
  ].join('\n') + '\n');
  const child = spawn('prometheus', [`--config.file=${path.join(work, 'prometheus.yml')}`,
                                     `--storage.tsdb.path=${path.join(work, 'tsdb')}`,
                                     `--web.listen-address=127.0.0.1:${port}`], {stdio: ['ignore', 'pipe', 'pipe']});
  prom = {child, log: ''};
  child.stdout.on('data', (d) => (prom.log += d));
  child.stderr.on('data', (d) => (prom.log += d));
  // Ready, and has scraped fathom at least once.
  await waitFor('up{job="fathom"}', (v) => v === 1, 60000);
});

after(async () => {
  prom.child.kill('SIGTERM');
  assert.equal(await srv.stop(), 0, srv.stderr);
  fs.rmSync(work, {recursive: true, force: true});
});

test('Prometheus sees the TTFT histogram count and token counters go up by what was sent', async () => {
  const q = {
    ttft: 'fathom_time_to_first_token_seconds_count',
    gen: 'fathom_generation_tokens_total',
    prompt: 'fathom_prompt_tokens_total',
    ok: 'sum(fathom_requests_total{status="200"}) or vector(0)',
  };
  const base = {};
  for (const [k, expr] of Object.entries(q)) base[k] = await waitFor(expr, (v) => !Number.isNaN(v));
  const N = 6;
  let gen = 0, prompt = 0;
  for (let i = 0; i < N; i++) {
    const stream = i % 2 === 0;
    const r = await fetch(srv.url + '/v1/completions', {
      method: 'POST', headers: {'content-type': 'application/json'},
      body: JSON.stringify({prompt: 'Count:', max_tokens: 3 + i, stream, stream_options: stream ? {include_usage: true} : undefined}),
    });
    assert.equal(r.status, 200);
    let usage;
    if (stream) {
      const text = await r.text();
      const chunks = text.split('\n').filter((l) => l.startsWith('data: {')).map((l) => JSON.parse(l.slice(6)));
      usage = chunks.at(-1).usage;
    } else {
      usage = (await r.json()).usage;
    }
    gen += usage.completion_tokens;
    prompt += usage.prompt_tokens;
  }
  assert.equal(gen, [3, 4, 5, 6, 7, 8].reduce((a, b) => a + b));
  await waitFor(q.ttft, (v) => v === base.ttft + N);
  await waitFor(q.gen, (v) => v === base.gen + gen);
  await waitFor(q.prompt, (v) => v === base.prompt + prompt);
  await waitFor(q.ok, (v) => v === base.ok + N);
  // A quantile query like the dashboard's works on the scraped histogram.
  const p99 = await promQuery('histogram_quantile(0.99, sum by (le) (rate(fathom_time_to_first_token_seconds_bucket[1m])))');
  assert.ok(p99 > 0, String(p99));
});

test('every metric the Grafana dashboard queries exists in the live /metrics', async () => {
  const metrics = await (await fetch(srv.url + '/metrics')).text();
  const file = path.join(work, 'metrics.txt');
  fs.writeFileSync(file, metrics);
  const out = execFileSync('python3', [path.join(repoRoot, 'tests/deploy/check_dashboard.py'),
                                       path.join(repoRoot, 'deploy/grafana/fathom.json'), '--metrics', file,
                                       '--names', path.join(repoRoot, 'tests/deploy/gpu_metric_names.txt')]);
  assert.match(out.toString(), / 0 errors/);
});

test('POST /debug/trace records engine steps and request spans with flow arrows', async () => {
  const tracing = fetch(srv.url + '/debug/trace?seconds=2', {method: 'POST'});
  await sleep(300);
  assert.equal((await fetch(srv.url + '/debug/trace?seconds=1', {method: 'POST'})).status, 409);  // one at a time
  for (let i = 0; i < 3; i++) {
    await fetch(srv.url + '/v1/completions', {method: 'POST', headers: {'content-type': 'application/json'},
                                               body: JSON.stringify({prompt: 'Count:', max_tokens: 3})});
  }
  const r = await tracing;
  assert.equal(r.status, 200);
  const trace = await r.json();
  const names = new Set(trace.traceEvents.map((e) => e.name));
  for (const n of ['step', 'forward', 'schedule', 'request', 'parse+tokenize+submit', 'respond']) assert.ok(names.has(n), n);
  const steps = trace.traceEvents.filter((e) => e.name === 'step' && e.ph === 'X');
  assert.ok(steps.length >= 3);
  assert.ok(steps.every((e) => ['prefill', 'decode', 'mixed'].includes(e.args.kind)));
  const starts = trace.traceEvents.filter((e) => e.ph === 's').map((e) => e.id);
  const ends = new Set(trace.traceEvents.filter((e) => e.ph === 'f').map((e) => e.id));
  assert.equal(starts.length, 3);
  for (const id of starts) assert.ok(ends.has(id), `flow ${id} has no end`);
  const threads = trace.traceEvents.filter((e) => e.ph === 'M' && e.name === 'thread_name').map((e) => e.args.name);
  assert.ok(threads.includes('engine'));
});
