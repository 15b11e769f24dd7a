// Bad input over raw sockets, slow and half-closed clients, 1,000 concurrent streams, client disconnects and
// SIGTERM under load, against `fathom serve` with the scripted test model.
import {test, before, after} from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import {buildScriptedModel, parseResponse, rawRequest, readSse, scrape, sleep, startServer, tmpDir} from './lib/fathom.mjs';

const kAssistant = 128804;
let model, srv;

function post(pathname, body, extraHeaders = '') {
  const text = typeof body === 'string' ? body : JSON.stringify(body);
  return `POST ${pathname} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(text)}\r\n` +
         `Connection: close\r\n${extraHeaders}\r\n${text}`;
}

async function completion(url, body) {
  const r = await fetch(url + '/v1/completions', {method: 'POST', headers: {'content-type': 'application/json'}, body: JSON.stringify(body)});
  return {status: r.status, body: await r.json()};
}

before(async () => {
  model = buildScriptedModel(path.join(tmpDir('fathom-e2e-'), 'model'), [
    {triggerId: kAssistant, text: 'The answer is 4.', end: 'eos'},
    {trigger: 'Count:', text: ' one two three four five six seven eight nine ten', end: 'eos'},
    {trigger: 'Loop', text: ' tick tock', end: 'cycle'},
  ], {maxPositions: 1 << 17});  // room for 'Loop' requests that outlast a shutdown at any decode speed
  srv = await startServer(['--model', model.dir, '--max-model-len', '4096', '--max-request-bytes', '65536',
                           '--header-timeout-s', '5', '--max-num-seqs', '256', '--max-num-batched-tokens', '4096',
                           '--http-threads', '2', '--threads', '2']);
});

after(async () => {
  const code = await srv.stop();
  assert.equal(code, 0, srv.stderr);
});

test('malformed JSON, wrong types, out-of-range values and unknown models get 400/404 bodies', async () => {
  const cases = [
    ['/v1/completions', '{"prompt": "Count:", ', 400, null, 'invalid_json'],
    ['/v1/completions', '[1,2,3]', 400, null, 'invalid_json'],
    ['/v1/completions', '['.repeat(10000), 400, null, 'invalid_json'],
    ['/v1/completions', {prompt: 42}, 400, 'prompt', 'invalid_value'],
    ['/v1/completions', {prompt: 'Count:', max_tokens: 'ten'}, 400, 'max_tokens', 'invalid_value'],
    ['/v1/completions', {prompt: 'Count:', max_tokens: -1}, 400, 'max_tokens', 'invalid_value'],
    ['/v1/completions', {prompt: 'Count:', top_p: 0}, 400, 'top_p', 'invalid_value'],
    ['/v1/completions', {prompt: 'Count:', n: 1000}, 400, 'n', 'invalid_value'],
    ['/v1/completions', {prompt: [1, 2, 99999999]}, 400, 'prompt', 'invalid_value'],
    ['/v1/completions', {prompt: 'Count:', logit_bias: {'abc': 1}}, 400, 'logit_bias', 'invalid_value'],
    ['/v1/completions', {prompt: 'Count:', stream: 'yes'}, 400, 'stream', 'invalid_value'],
    ['/v1/chat/completions', {messages: 'hi'}, 400, 'messages', 'invalid_value'],
    ['/v1/chat/completions', {messages: [{role: 'wizard', content: 'hi'}]}, 400, 'messages[0].role', 'invalid_value'],
    ['/v1/chat/completions', {messages: [{role: 'user', content: [{type: 'image_url', image_url: {url: 'x'}}]}]}, 400,
     'messages[0].content[0].type', 'unsupported_parameter'],
    ['/v1/chat/completions', {model: 'gpt-4', messages: [{role: 'user', content: 'hi'}]}, 404, 'model', 'model_not_found'],
    ['/v1/completions', {prompt: 'word '.repeat(5000), max_tokens: 10}, 400, 'prompt', 'context_length_exceeded'],
  ];
  for (const [route, body, status, param, code] of cases) {
    const {data} = await rawRequest(srv.port, [post(route, body)]);
    const r = parseResponse(data);
    assert.equal(r.status, status, `${route} ${JSON.stringify(body).slice(0, 80)}: ${data.slice(0, 300)}`);
    const err = JSON.parse(r.body).error;
    assert.equal(err.param, param, JSON.stringify(err));
    assert.equal(err.code, code, JSON.stringify(err));
    assert.equal(typeof err.message, 'string');
    assert.ok(err.type);
  }
  // Context overflow names both numbers.
  const long = await completion(srv.url, {prompt: 'word '.repeat(5000), max_tokens: 10});
  assert.match(long.body.error.message, /4096/);
  assert.match(long.body.error.message, /500\d/);
  // Unknown routes and methods.
  assert.equal(parseResponse((await rawRequest(srv.port, ['GET /v2/nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n'])).data).status, 404);
  assert.equal(parseResponse((await rawRequest(srv.port, ['GET /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n'])).data).status, 405);
  // Still serving.
  assert.equal((await completion(srv.url, {prompt: 'Count:', max_tokens: 2})).body.choices[0].text, ' one two');
});

test('an oversized body gets 413, garbage gets 400, and neither stops the server', async () => {
  const big = JSON.stringify({prompt: 'x'.repeat(70000)});
  const r = parseResponse((await rawRequest(srv.port, [post('/v1/completions', big)])).data);
  assert.equal(r.status, 413);
  assert.equal(JSON.parse(r.body).error.code, 'payload_too_large');
  const g = await rawRequest(srv.port, ['\x00\x01garbage\r\n\r\n']);
  assert.equal(parseResponse(g.data).status, 400);
  assert.equal((await completion(srv.url, {prompt: 'Count:', max_tokens: 1})).status, 200);
});

test('a client sending its headers byte by byte is cut off with 408 while others are served', async () => {
  const req = post('/v1/completions', {prompt: 'Count:', max_tokens: 1});
  const slow = rawRequest(srv.port, req.split(''), {delayMs: 100, timeoutMs: 15000});
  // Meanwhile, normal requests complete promptly.
  const t0 = Date.now();
  for (let i = 0; i < 3; i++) assert.equal((await completion(srv.url, {prompt: 'Count:', max_tokens: 2})).status, 200);
  assert.ok(Date.now() - t0 < 10000);
  const s = await slow;
  assert.equal(parseResponse(s.data).status, 408, s.data);
});

test('a half-closed connection still gets its error answer', async () => {
  const r = await rawRequest(srv.port, [post('/v1/completions', '{"prompt": ')], {halfClose: true});
  assert.equal(parseResponse(r.data).status, 400);
  const t = await rawRequest(srv.port, ['POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"pro'], {halfClose: true});
  assert.ok(t.data === '' || parseResponse(t.data).status === 400, t.data);
  assert.equal((await completion(srv.url, {prompt: 'Count:', max_tokens: 1})).status, 200);
});

test('a half-close after a complete request still gets the whole answer', async () => {
  const r = await rawRequest(srv.port, [post('/v1/completions', {prompt: 'Count:', max_tokens: 3})], {halfClose: true});
  const res = parseResponse(r.data);
  assert.equal(res.status, 200, r.data);
  assert.equal(JSON.parse(res.body).choices[0].text, ' one two three');
});

test('JSON that would parse in quadratic time is refused at once, naming the limit', async () => {
  // 100k keys in one object (about 1 MB): nlohmann's ordered_json inserts in linear time per key.
  const keys = Array.from({length: 100000}, (_, i) => `"k${i}":0`).join(',');
  const body = `{"prompt":"Count:","unknown":{${keys}}}`;
  const local = await startServer(['--model', model.dir, '--max-request-bytes', '4MiB', '--access-log', 'off']);
  try {
    const [r, health] = await Promise.all([
      fetch(local.url + '/v1/completions', {method: 'POST', headers: {'content-type': 'application/json'}, body}),
      fetch(local.url + '/health'),
    ]);
    assert.equal(r.status, 400);
    assert.match((await r.json()).error.message, /more than 1024 keys/);
    assert.equal(health.status, 200);
  } finally {
    await local.stop('SIGKILL');
  }
});

test('a client that disconnects mid-stream has its request aborted and its KV blocks freed', async () => {
  const controller = new AbortController();
  const before = await scrape(srv.url);
  const r = await fetch(srv.url + '/v1/completions', {
    method: 'POST', headers: {'content-type': 'application/json'}, signal: controller.signal,
    body: JSON.stringify({prompt: 'Loop', max_tokens: 3000, stream: true}),
  });
  let n = 0;
  try {
    await readSse(r, {onEvent: () => {
      if (++n === 5) controller.abort();
    }});
  } catch (e) {
    assert.equal(e.name, 'AbortError');
  }
  // The engine's gauges, summed over its replicas (one here; the labels name it and its device).
  const gauge = (m, name) => {
    const keys = Object.keys(m).filter((k) => k.startsWith(name + '{replica="'));
    assert.ok(keys.length > 0, `no ${name} series`);
    return keys.reduce((a, k) => a + m[k], 0);
  };
  // The request's record (and so its counter) comes when its job ends, which may be just after the engine frees
  // its blocks: wait for all three.
  const key = 'fathom_requests_total{finish_reason="abort",status="499"}';
  let m;
  for (let i = 0; i < 100; i++) {
    m = await scrape(srv.url);
    if (gauge(m, 'fathom_kv_cache_blocks_used') === 0 && gauge(m, 'fathom_requests_running') === 0 &&
        (m[key] || 0) - (before[key] || 0) >= 1) {
      break;
    }
    await sleep(50);
  }
  assert.equal(gauge(m, 'fathom_kv_cache_blocks_used'), 0);
  assert.equal(gauge(m, 'fathom_requests_running'), 0);
  assert.equal((m[key] || 0) - (before[key] || 0), 1);
  // Far fewer than 3000 tokens were generated.
  assert.ok(m['fathom_generation_tokens_total'] - before['fathom_generation_tokens_total'] < 500);
});

test('1,000 concurrent streaming clients all complete on a few dozen threads', async () => {
  const N = 1000;
  let maxThreads = 0;
  const sampler = setInterval(() => (maxThreads = Math.max(maxThreads, srv.threads())), 50);
  const one = async () => {
    let r;
    try {
      r = await fetch(srv.url + '/v1/completions', {
        method: 'POST', headers: {'content-type': 'application/json'},
        body: JSON.stringify({prompt: 'Count:', max_tokens: 4, stream: true}),
      });
    } catch (e) {
      throw new Error(`fetch failed: ${e.cause && (e.cause.code || e.cause.message)}; server log:\n${srv.stderr.slice(-2000)}`);
    }
    assert.equal(r.status, 200);
    const events = await readSse(r);
    assert.equal(events.at(-1).data, '[DONE]');
    return events.filter((e) => e.data !== '[DONE]').map((e) => JSON.parse(e.data).choices[0].text).join('');
  };
  // Open all connections first so that they really are concurrent.
  const texts = await Promise.all(Array.from({length: N}, one));
  clearInterval(sampler);
  assert.equal(texts.length, N);
  for (const t of texts) assert.equal(t, ' one two three four');
  assert.ok(maxThreads > 0 && maxThreads <= 40, `the server ran ${maxThreads} threads`);
});

test('SIGTERM under load: in-flight requests finish or end with abort, and the exit code is 0', async () => {
  const local = await startServer(['--model', model.dir, '--shutdown-grace-s', '2', '--access-log', 'off']);
  try {
  const short = Array.from({length: 4}, () => completion(local.url, {prompt: 'Count:', max_tokens: 3}));
  const streams = Array.from({length: 4}, async () => {
    const r = await fetch(local.url + '/v1/completions', {
      method: 'POST', headers: {'content-type': 'application/json'},
      body: JSON.stringify({prompt: 'Loop', max_tokens: 100000, stream: true}),
    });
    const events = await readSse(r);
    return events;
  });
  await sleep(500);
  const code = await local.stop('SIGTERM');
  assert.equal(code, 0, local.stderr);
  for (const s of await Promise.all(short)) {
    // Finished within the grace period, or cut short with finish_reason "abort".
    assert.equal(s.status, 200);
    const c = s.body.choices[0];
    if (c.finish_reason === 'length') {
      assert.equal(c.text, ' one two three');
    } else {
      assert.equal(c.finish_reason, 'abort');
    }
  }
  for (const events of await Promise.all(streams)) {
    assert.equal(events.at(-1).data, '[DONE]');
    const last = JSON.parse(events.at(-2).data);
    assert.equal(last.choices[0].finish_reason, 'abort');
  }
  assert.match(local.stderr, /draining/);
  } finally {
    await local.stop('SIGKILL');  // no-op once it exited; never leave a server behind a failed assertion
  }
});

test('while draining, a new connection is answered 503 (and /health says draining), not refused', async () => {
  const local = await startServer(['--model', model.dir, '--shutdown-grace-s', '3', '--access-log', 'off']);
  try {
    const stream = fetch(local.url + '/v1/completions', {method: 'POST', headers: {'content-type': 'application/json'},
                                                          body: JSON.stringify({prompt: 'Loop', max_tokens: 100000, stream: true})})
                       .then((r) => readSse(r));
    await sleep(300);
    local.child.kill('SIGTERM');
    await sleep(300);
    const health = await fetch(local.url + '/health');
    assert.equal(health.status, 503);
    assert.equal((await health.json()).status, 'draining');
    const late = await completion(local.url, {prompt: 'Count:', max_tokens: 3});
    assert.equal(late.status, 503);
    assert.equal(late.body.error.code, 'draining');
    assert.equal(await local.exited, 0, local.stderr);
    assert.equal((await stream).at(-1).data, '[DONE]');
  } finally {
    await local.stop('SIGKILL');
  }
});

test('overload: 429 with Retry-After when the queue is full, 503 after the queue delay', async () => {
  const local = await startServer(['--model', model.dir, '--max-num-seqs', '1', '--max-queue-len', '1',
                                   '--max-queue-delay-ms', '1500', '--shutdown-grace-s', '1', '--access-log', 'off']);
  try {
  const body = (max) => JSON.stringify({prompt: 'Loop', max_tokens: max});
  const post = (max) => fetch(local.url + '/v1/completions', {method: 'POST', headers: {'content-type': 'application/json'}, body: body(max)});
  // Occupies the only sequence slot until the shutdown. Its body is read as it arrives (a client that stops reading
  // stalls the server's write of a long body past the shutdown's flush); a failure is kept for the check below.
  const running = post(100000).then(async (r) => ({status: r.status, body: await r.json()})).catch((e) => e);
  await sleep(300);
  const queued = post(2);      // waits in the queue; times out after 1.5 s
  await sleep(300);
  const full = await post(2);  // the queue already holds one
  assert.equal(full.status, 429);
  assert.ok(Number(full.headers.get('retry-after')) >= 1);
  assert.equal((await full.json()).error.code, 'queue_full');
  const timedOut = await queued;
  assert.equal(timedOut.status, 503);
  assert.equal((await timedOut.json()).error.code, 'queue_timeout');
  const m = await scrape(local.url);
  assert.equal(m['fathom_requests_rejected_total{reason="queue_full"}'], 1);
  assert.equal(m['fathom_requests_rejected_total{reason="queue_timeout"}'], 1);
  assert.equal(await local.stop('SIGINT'), 0, local.stderr);
  const r = await running;
  if (r instanceof Error) {
    throw new Error(`the running request got no response (${r.message}); server log:\n${local.stderr.slice(-3000)}`);
  }
  assert.equal(r.status, 200);
  assert.equal(r.body.choices[0].finish_reason, 'abort');  // cut short by the shutdown
  } finally {
    await local.stop('SIGKILL');
  }
});

test('every 429 carries Retry-After and is counted as queue_full, however the race falls', async () => {
  const local = await startServer(['--model', model.dir, '--max-num-seqs', '1', '--max-queue-len', '1',
                                   '--shutdown-grace-s', '0', '--access-log', 'off']);
  try {
    const before = await scrape(local.url);
    // Many at once: some are refused at Submit, some (the queue filled between Submit's check and the engine thread)
    // on the engine thread.
    const rs = await Promise.all(Array.from({length: 200}, () =>
      fetch(local.url + '/v1/completions', {method: 'POST', headers: {'content-type': 'application/json'},
                                            body: JSON.stringify({prompt: 'Count:', max_tokens: 2})})));
    const refused = rs.filter((r) => r.status === 429);
    assert.ok(refused.length > 0);
    for (const r of refused) {
      assert.ok(Number(r.headers.get('retry-after')) >= 1);
      assert.equal((await r.json()).error.code, 'queue_full');
    }
    for (const r of rs.filter((x) => x.status !== 429)) assert.equal(r.status, 200);
    const after = await scrape(local.url);
    const key = 'fathom_requests_rejected_total{reason="queue_full"}';
    assert.equal(after[key] - (before[key] || 0), refused.length);
  } finally {
    await local.stop('SIGKILL');
  }
});

// ---- One client's request cannot take the server down, desync a proxy, eat its memory or stall the others.

const countResponses = (data) => (data.match(/HTTP\/1\.1 \d{3} /g) || []).length;
const rssKiB = (pid) => Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))[1]);

test('Transfer-Encoding other than a final chunked, or with Content-Length, is a 400 and a closed connection', async () => {
  // Each would be framed by Content-Length by a lenient server, while a proxy reading it as chunked sees the GET
  // inside as a second request (smuggling).
  const inner = 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n';
  const cases = [
    'Transfer-Encoding: chunked\r\nContent-Length: 4\r\n',
    'Transfer-Encoding: xchunked\r\nContent-Length: 4\r\n',
    'Transfer-Encoding: identity\r\nContent-Length: 4\r\n',
    'Transfer-Encoding: gzip\r\nContent-Length: 4\r\n',
    'Transfer-Encoding: gzip, chunked\r\n',
    'Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n',
    'Transfer-Encoding:\r\n chunked\r\nContent-Length: 4\r\n',  // obs-fold
  ];
  for (const te of cases) {
    const r = await rawRequest(srv.port, [`POST /v1/completions HTTP/1.1\r\nHost: x\r\n${te}\r\n0\r\n\r\n${inner}`]);
    assert.equal(countResponses(r.data), 1, `${JSON.stringify(te)}: ${r.data.slice(0, 300)}`);
    assert.equal(parseResponse(r.data).status, 400, JSON.stringify(te));
    assert.equal(r.timedOut, false, 'the connection was not closed');
  }
  // A plain chunked body is fine.
  const body = JSON.stringify({prompt: 'Count:', max_tokens: 1});
  const ok = await rawRequest(srv.port, [`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
                                         `Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n` +
                                         `${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`]);
  assert.equal(parseResponse(ok.data).status, 200, ok.data);
});

test('HEAD gets the head alone, and requests pipelined before a half-close are all answered', async () => {
  const r = await rawRequest(srv.port, ['HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n' +
                                        'GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n']);
  const head = parseResponse(r.data);
  assert.equal(head.status, 200);
  assert.ok(Number(head.headers['content-length']) > 0);
  assert.ok(head.body.startsWith('HTTP/1.1 200 OK'), `bytes after HEAD's head: ${JSON.stringify(head.body.slice(0, 40))}`);
  assert.equal(countResponses(r.data), 2);
  // Three requests, then the client shuts down its sending side: three answers, then the close.
  const get = 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n';
  const body = JSON.stringify({prompt: 'Count:', max_tokens: 2});
  const gen = `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`;
  const p = await rawRequest(srv.port, [get + gen + get], {halfClose: true});
  assert.equal(countResponses(p.data), 3, p.data);
  assert.match(p.data, /" one two"/);
  assert.equal(p.timedOut, false);
});

test('chunk-size lines, chunk extensions and trailers are bounded; a stalled request keeps its header timeout', async () => {
  const pid = srv.child.pid;
  const before = rssKiB(pid);
  const head = 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n';
  const mb = 'a'.repeat(1 << 20);
  const endless = [
    [head + '5;ext=', ...Array(8).fill(mb)],            // a chunk extension that never ends
    [head + 'f'.repeat(1000), ...Array(8).fill('f'.repeat(1 << 20))],  // a chunk-size line that never ends
    [head + '0\r\nX-Trailer: ', ...Array(8).fill(mb)],  // a trailer that never ends
  ];
  const results = await Promise.all(endless.map((chunks) => rawRequest(srv.port, chunks, {timeoutMs: 10000})));
  for (const r of results) {
    assert.ok(r.data.length > 0, `no answer (${r.error || 'timeout'})`);
    assert.ok([400, 431].includes(parseResponse(r.data).status), r.data.slice(0, 200));
  }
  const grew = rssKiB(pid) - before;
  assert.ok(grew < 64 * 1024, `RSS grew by ${grew} KiB`);
  // After one complete request, a second that begins and stalls gets 408 after --header-timeout-s (5 s), not the
  // keep-alive idle timeout (60 s).
  const t0 = Date.now();
  const req = 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n';
  const stalled = await rawRequest(srv.port, [req, 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{'],
                                   {delayMs: 200, timeoutMs: 20000});
  assert.equal(countResponses(stalled.data), 2);
  assert.match(stalled.data, /HTTP\/1\.1 408 /);
  assert.ok(Date.now() - t0 < 12000, `took ${Date.now() - t0} ms`);
});

test('structured output: min_tokens past every choice is a 400; top_k and priority past 2^63 are 400s', async () => {
  const r = await completion(srv.url, {prompt: 'Count:', guided_choice: ['yes'], min_tokens: 3, max_tokens: 8});
  assert.equal(r.status, 400, JSON.stringify(r.body));
  assert.equal(r.body.error.param, 'min_tokens');
  const fine = await completion(srv.url, {prompt: 'Count:', guided_choice: ['yes'], min_tokens: 1, max_tokens: 8});
  assert.equal(fine.status, 200, JSON.stringify(fine.body));
  assert.equal(fine.body.choices[0].text, 'yes');
  for (const field of ['"top_k":18446744073709551615', '"priority":18446744073708551616']) {
    const raw = await rawRequest(srv.port, [post('/v1/completions', `{"prompt":"Count:",${field}}`)]);
    assert.equal(parseResponse(raw.data).status, 400, field);
  }
});

test('guided_json as a string nested 200,000 deep, and a 150,000-rule GBNF chain, are 400s (they crashed the server)', async () => {
  const local = await startServer(['--model', model.dir, '--access-log', 'off']);
  try {
    const deep = '['.repeat(200000) + ']'.repeat(200000);
    const a = await completion(local.url, {prompt: 'x', guided_json: deep});
    assert.equal(a.status, 400);
    assert.equal(a.body.error.param, 'guided_json');
    let gbnf = 'root ::= r0\n';
    for (let i = 0; i < 150000; i++) gbnf += `r${i} ::= r${i + 1}\n`;
    gbnf += 'r150000 ::= "x"\n';
    const b = await completion(local.url, {prompt: 'x', guided_grammar: gbnf});
    assert.equal(b.status, 400, JSON.stringify(b.body));
    assert.match(b.body.error.message, /too deep/);
    assert.equal((await fetch(local.url + '/health')).status, 200);
  } finally {
    assert.equal(await local.stop(), 0, local.stderr);
  }
});

test('heavy requests run off the I/O threads, large answers arrive whole, and buffered bodies have a global cap', async () => {
  const local = await startServer(['--model', model.dir, '--access-log', 'off', '--max-request-bytes', '8MiB',
                                   '--max-buffered-request-bytes', '16MiB', '--http-threads', '2', '--api-threads', '2']);
  try {
    // Two clients loop 8 MiB /tokenize requests; /health stays responsive meanwhile.
    const big = JSON.stringify({prompt: 'word '.repeat((8 << 20) / 5 - 10)});
    let stop = false;
    const loops = [0, 1].map(async () => {
      let n = 0;
      while (!stop && n < 4) {
        const r = await fetch(local.url + '/tokenize', {method: 'POST', headers: {'content-type': 'application/json'}, body: big});
        assert.equal(r.status, 200);
        await r.arrayBuffer();
        n++;
      }
      return n;
    });
    await sleep(300);
    const waits = [];
    for (let i = 0; i < 40; i++) {
      const t0 = performance.now();
      assert.equal((await fetch(local.url + '/health')).status, 200);
      waits.push(performance.now() - t0);
      await sleep(50);
    }
    stop = true;
    await Promise.all(loops);
    waits.sort((x, y) => x - y);
    console.log(`/health under two 8 MiB /tokenize loops: p50 ${waits[20].toFixed(1)} ms, max ${waits.at(-1).toFixed(1)} ms`);
    assert.ok(waits.at(-1) < 1000, `/health waited ${waits.at(-1).toFixed(0)} ms`);

    // An answer larger than 16 MiB (the cap on unread stream output) arrives whole: /detokenize of many copies of a
    // long token (128 spaces are one token of the DeepSeek-V3 vocabulary).
    const probe = await (await fetch(local.url + '/tokenize', {method: 'POST', headers: {'content-type': 'application/json'},
                                                             body: JSON.stringify({prompt: ' '.repeat(128)})})).json();
    const id = probe.tokens.at(-1);  // after the BOS
    const piece = (await (await fetch(local.url + '/detokenize', {method: 'POST', headers: {'content-type': 'application/json'},
                                                                 body: JSON.stringify({tokens: [id]})})).json()).prompt;
    assert.ok(piece.length >= 64, `token ${id} (${JSON.stringify(piece)}) is too short for the test`);
    const n = Math.ceil((20 << 20) / piece.length);  // a 20 MiB answer
    const d = await fetch(local.url + '/detokenize', {method: 'POST', headers: {'content-type': 'application/json'},
                                                      body: JSON.stringify({tokens: Array(n).fill(id)})});
    assert.equal(d.status, 200);
    assert.equal((await d.json()).prompt.length, n * piece.length);

    // Three stalled 7 MiB uploads: the third would pass 16 MiB buffered in all, and is answered 503 at once.
    const part = 'x'.repeat(7 << 20);
    const stalled = [0, 1, 2].map(() => rawRequest(local.port, [
      `POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${(7 << 20) + 100}\r\n\r\n`, part,
    ], {delayMs: 100, timeoutMs: 15000}));
    const answers = await Promise.all(stalled);
    const statuses = answers.map((r) => (r.data ? parseResponse(r.data).status : 0));
    assert.ok(statuses.includes(503), `statuses ${statuses}`);
    const busy = answers.find((r) => r.data && parseResponse(r.data).status === 503);
    assert.equal(JSON.parse(parseResponse(busy.data).body).error.code, 'server_busy');
    assert.equal((await fetch(local.url + '/health')).status, 200);
  } finally {
    assert.equal(await local.stop(), 0, local.stderr);
  }
});

test('cache_salt and API keys separate the prefix cache; --prefix-cache-isolation shared lets keys share it', async () => {
  const prompt = 'word '.repeat(80);
  const cached = async (url, extra = {}, key = null) => {
    const headers = {'content-type': 'application/json'};
    if (key) headers.authorization = `Bearer ${key}`;
    const r = await fetch(url + '/v1/completions', {method: 'POST', headers, body: JSON.stringify({prompt, max_tokens: 1, ...extra})});
    const body = await r.json();
    assert.equal(r.status, 200, JSON.stringify(body));
    return body.usage.prompt_tokens_details.cached_tokens;
  };
  const salt = `s-${Date.now()}`;
  assert.equal(await cached(srv.url, {cache_salt: salt}), 0);
  assert.ok(await cached(srv.url, {cache_salt: salt}) > 0);
  assert.equal(await cached(srv.url, {cache_salt: salt + 'x'}), 0);  // a wrong guess learns nothing
  for (const [isolation, shared] of [['per-key', false], ['shared', true]]) {
    const local = await startServer(['--model', model.dir, '--access-log', 'off', '--api-key', 'k1,k2',
                                     '--prefix-cache-isolation', isolation]);
    try {
      assert.equal(await cached(local.url, {}, 'k1'), 0);
      assert.ok(await cached(local.url, {}, 'k1') > 0);
      assert.equal((await cached(local.url, {}, 'k2')) > 0, shared, isolation);
      const r = await fetch(local.url + '/v1/models', {headers: {authorization: 'Bearer k3'}});
      assert.equal(r.status, 401);
    } finally {
      assert.equal(await local.stop(), 0, local.stderr);
    }
  }
});

test('no request so far reached the exception barrier', async () => {
  const m = await scrape(srv.url);
  const seen = Object.entries(m).filter(([k]) => k.startsWith('fathom_internal_errors_total'));
  assert.ok(seen.length >= 1);
  for (const [k, v] of seen) assert.equal(v, 0, k);
});
