// Helpers for the end-to-end tests: start `fathom serve` on a free port, build the scripted test model, raw HTTP.
//
//   const model = await buildScriptedModel(tmpdir, [{trigger: 'Count:', text: ' one two three', end: 'eos'}]);
//   const srv = await startServer(['--model', model.dir, '--max-num-seqs', '64']);
//   const client = new OpenAI({baseURL: srv.url + '/v1', apiKey: 'x'});
//   ...
//   await srv.stop();                     // SIGTERM, resolves with the exit code
import {spawn, execFileSync} from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import zlib from 'node:zlib';
import {fileURLToPath} from 'node:url';
import OpenAI from 'openai';

const here = path.dirname(fileURLToPath(import.meta.url));
export const repoRoot = path.resolve(here, '../../..');
export const fathomBin = process.env.FATHOM_BIN || path.join(repoRoot, 'build/cpu-debug/bin/fathom');
export const dataDir = path.join(repoRoot, 'tests/data');

export function tmpDir(prefix) {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

// The DeepSeek-V3 tokenizer (tests/data copy) in `dir`.
export function writeTokenizer(dir) {
  const src = path.join(dataDir, 'tokenizers/deepseek-v3');
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), zlib.gunzipSync(fs.readFileSync(path.join(src, 'tokenizer.json.gz'))));
  fs.copyFileSync(path.join(src, 'tokenizer_config.json'), path.join(dir, 'tokenizer_config.json'));
}

export function tokenize(tokDir, text) {
  const out = execFileSync(fathomBin, ['--log-level', 'error', 'tokenize', '--tokenizer', tokDir, '--text', text]);
  return JSON.parse(out.toString().trim());
}

function bf16(x) {
  const f = new Float32Array([x]);
  return new Uint16Array(f.buffer)[1];  // exact for the values used here (0, 1, small powers of two)
}

// A Llama-architecture model whose greedy (and, at temperature 1, near-certain) continuation is scripted: the only
// layer's attention and MLP outputs are zero, so the logits depend on the last token alone, and lm_head maps each
// scripted token to its successor with logit 32 against 0 for every other token. A real checkpoint run through the
// real engine, not a mock: a bigram table written as weights.
//
// scripts: [{trigger, text, end: 'eos' | 'cycle'}]: after a prompt whose last token is the trigger's last token,
// the model writes `text`, then EOS ('eos') or `text` again forever ('cycle'). Tokens that start no script lead to
// EOS. The special token <｜Assistant｜> may be a trigger (chat prompts end with it).
// maxPositions: the config's max_position_embeddings (the server's default --max-model-len).
export function buildScriptedModel(dir, scripts, {maxPositions = 4096} = {}) {
  fs.mkdirSync(dir, {recursive: true});
  writeTokenizer(dir);
  const hidden = 64, vocab = 129280, eos = 1, inter = 64;
  const next = new Map();  // token -> successor
  const setNext = (a, b) => {
    if (next.has(a) && next.get(a) !== b) throw new Error(`token ${a} has two successors (${next.get(a)}, ${b})`);
    next.set(a, b);
  };
  const scriptIds = [];
  for (const s of scripts) {
    const trig = s.triggerId !== undefined ? s.triggerId : tokenize(dir, s.trigger).at(-1);
    const ids = tokenize(dir, s.text);
    let prev = trig;
    for (const id of ids) {
      setNext(prev, id);
      prev = id;
    }
    setNext(prev, s.end === 'cycle' ? ids[0] : eos);
    scriptIds.push({trigger: trig, ids});
  }
  // Each token with a successor gets its own embedding direction (dimension); the last dimension is "anything else".
  const dims = new Map();
  for (const a of next.keys()) {
    if (dims.size >= hidden - 1) throw new Error('too many scripted tokens for the hidden size');
    dims.set(a, dims.size);
  }
  const other = hidden - 1;
  const embed = new Uint16Array(vocab * hidden);
  const lmHead = new Uint16Array(vocab * hidden);
  const one = bf16(1), four = bf16(4);
  for (let t = 0; t < vocab; t++) embed[t * hidden + (dims.has(t) ? dims.get(t) : other)] = one;
  for (const [a, b] of next) lmHead[b * hidden + dims.get(a)] = four;
  lmHead[eos * hidden + other] = four;

  const tensors = [];
  const add = (name, shape, data) => tensors.push({name, shape, data});
  const ones = (n) => new Uint16Array(n).fill(one);
  add('model.embed_tokens.weight', [vocab, hidden], embed);
  add('lm_head.weight', [vocab, hidden], lmHead);
  add('model.norm.weight', [hidden], ones(hidden));
  const p = 'model.layers.0.';
  add(p + 'input_layernorm.weight', [hidden], ones(hidden));
  add(p + 'post_attention_layernorm.weight', [hidden], ones(hidden));
  for (const w of ['q_proj', 'k_proj', 'v_proj', 'o_proj']) add(p + `self_attn.${w}.weight`, [hidden, hidden], new Uint16Array(hidden * hidden));
  add(p + 'mlp.gate_proj.weight', [inter, hidden], new Uint16Array(inter * hidden));
  add(p + 'mlp.up_proj.weight', [inter, hidden], new Uint16Array(inter * hidden));
  add(p + 'mlp.down_proj.weight', [hidden, inter], new Uint16Array(hidden * inter));

  const header = {__metadata__: {format: 'pt'}};
  let offset = 0;
  for (const t of tensors) {
    const bytes = t.data.byteLength;
    header[t.name] = {dtype: 'BF16', shape: t.shape, data_offsets: [offset, offset + bytes]};
    offset += bytes;
  }
  let headerText = JSON.stringify(header);
  while ((8 + headerText.length) % 8 !== 0) headerText += ' ';
  const fd = fs.openSync(path.join(dir, 'model.safetensors'), 'w');
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(headerText.length));
  fs.writeSync(fd, len);
  fs.writeSync(fd, Buffer.from(headerText));
  for (const t of tensors) fs.writeSync(fd, Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength));
  fs.closeSync(fd);

  const config = {
    architectures: ['LlamaForCausalLM'], model_type: 'llama', vocab_size: vocab, hidden_size: hidden,
    intermediate_size: inter, num_hidden_layers: 1, num_attention_heads: 1, num_key_value_heads: 1,
    hidden_act: 'silu', max_position_embeddings: maxPositions, rms_norm_eps: 1e-6, rope_theta: 10000,
    tie_word_embeddings: false, bos_token_id: 0, eos_token_id: eos, torch_dtype: 'bfloat16',
  };
  fs.writeFileSync(path.join(dir, 'config.json'), JSON.stringify(config, null, 2));
  return {dir, scripts: scriptIds};
}

// Starts `fathom serve --port 0 ...` and waits for /health 200. `log` collects stderr; `access` stdout lines.
// port: a fixed port (a process sharing it with --reuse-port is ready when its own log says so, since /health on a
// shared port may be answered by another process); 0: any free port.
// launcher: a command that starts fathom, e.g. ['mpirun', '-np', '2'] (the child is then the launcher).
export async function startServer(args, {env = {}, timeoutMs = 120000, port: fixedPort = 0, launcher = []} = {}) {
  // FATHOM_E2E_SERVE_ARGS adds flags to every server, e.g. "--device cuda" to run the suite on a GPU.
  const extra = (process.env.FATHOM_E2E_SERVE_ARGS || '').split(/\s+/).filter(Boolean);
  const argv = [fathomBin, 'serve', '--port', String(fixedPort), ...args, ...extra];
  const cmd = launcher.length ? [...launcher, ...argv] : argv;
  const child = spawn(cmd[0], cmd.slice(1), {env: {...process.env, ...env}, stdio: ['ignore', 'pipe', 'pipe']});
  const srv = {child, stderr: '', access: [], url: null, exitCode: null, threads: () => countThreads(child.pid)};
  let stdoutBuf = '';
  child.stdout.on('data', (d) => {
    stdoutBuf += d.toString();
    let i;
    while ((i = stdoutBuf.indexOf('\n')) >= 0) {
      const line = stdoutBuf.slice(0, i);
      stdoutBuf = stdoutBuf.slice(i + 1);
      if (line.trim()) srv.access.push(JSON.parse(line));
    }
  });
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => {
    srv.exitCode = code;
    srv.signal = signal;
    resolve(code);
  }));
  srv.exited = exited;
  // A server that does not come up is killed before the error goes on: a child left running would keep node's event
  // loop, and with it the whole test file, alive until ctest's timeout.
  try {
    await waitUntilServing(srv, child, exited, fixedPort, timeoutMs);
  } catch (e) {
    if (srv.exitCode === null) child.kill('SIGKILL');
    throw e;
  }
  srv.stop = async (signal = 'SIGTERM') => {
    if (srv.exitCode === null) child.kill(signal);
    return exited;
  };
  return srv;
}

// Resolves once `srv` listens (srv.port, srv.url) and is ready: healthy, or with a fixed (shared) port, its "ready"
// line; rejects if it exits first or takes longer than timeoutMs.
async function waitUntilServing(srv, child, exited, fixedPort, timeoutMs) {
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('server did not start:\n' + srv.stderr)), timeoutMs);
    child.stderr.on('data', (d) => {
      srv.stderr += d.toString();
      const m = srv.stderr.match(/listening on http:\/\/[\d.]+:(\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
    exited.then((code) => reject(new Error(`server exited with ${code}:\n${srv.stderr}`)));
  });
  srv.port = port;
  srv.url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (fixedPort !== 0) {
      if (/ready: serving/.test(srv.stderr)) break;
    } else {
      try {
        const r = await fetch(srv.url + '/health');
        if (r.status === 200) break;
      } catch {}
    }
    if (srv.exitCode !== null) throw new Error(`server exited:\n${srv.stderr}`);
    if (Date.now() > deadline) throw new Error('server not healthy in time:\n' + srv.stderr);
    await sleep(100);
  }
}

export function countThreads(pid) {
  try {
    return fs.readdirSync(`/proc/${pid}/task`).length;
  } catch {
    return -1;
  }
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// A free TCP port on 127.0.0.1 (bound and released: free a moment later unless another process takes it).
// `n` distinct free ports: all held open at once while they are chosen (freePort() twice may return one port twice).
export async function freePorts(n) {
  const servers = [];
  try {
    for (let i = 0; i < n; ++i) {
      const s = net.createServer();
      servers.push(s);
      await new Promise((resolve, reject) => {
        s.on('error', reject);
        s.listen(0, '127.0.0.1', resolve);
      });
    }
    return servers.map((s) => s.address().port);
  } finally {
    await Promise.all(servers.map((s) => new Promise((resolve) => s.close(() => resolve()))));
  }
}

export function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const {port} = s.address();
      s.close(() => resolve(port));
    });
  });
}

// Sends raw bytes over TCP and resolves with everything the server sent back until it closed (or timeoutMs).
export function rawRequest(port, chunks, {delayMs = 0, halfClose = false, timeoutMs = 20000} = {}) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1');
    let data = '';
    const timer = setTimeout(() => {
      sock.destroy();
      resolve({data, timedOut: true});
    }, timeoutMs);
    sock.on('data', (d) => (data += d.toString()));
    sock.on('close', () => {
      clearTimeout(timer);
      resolve({data, timedOut: false});
    });
    sock.on('error', (e) => {
      clearTimeout(timer);
      resolve({data, error: e.code});
    });
    sock.on('connect', async () => {
      for (const c of chunks) {
        sock.write(c);
        if (delayMs) await sleep(delayMs);
      }
      if (halfClose) sock.end();
    });
  });
}

// Parses "HTTP/1.1 400 ...\r\nheaders\r\n\r\nbody" (Content-Length bodies only).
export function parseResponse(text) {
  const head = text.indexOf('\r\n\r\n');
  const lines = text.slice(0, head).split('\r\n');
  const status = Number(lines[0].split(' ')[1]);
  const headers = {};
  for (const l of lines.slice(1)) {
    const i = l.indexOf(':');
    headers[l.slice(0, i).toLowerCase()] = l.slice(i + 1).trim();
  }
  return {status, headers, body: text.slice(head + 4)};
}

// Fetches /metrics and returns {name{labels}: value}.
export async function scrape(url) {
  const text = await (await fetch(url + '/metrics')).text();
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    out[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return out;
}

// Reads an SSE response body; returns [{id, data}] in order.
export async function readSse(response, {onEvent} = {}) {
  const events = [];
  const decoder = new TextDecoder();
  let buf = '';
  for await (const chunk of response.body) {
    buf += decoder.decode(chunk, {stream: true});
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const ev = {};
      for (const line of block.split('\n')) {
        if (line.startsWith('id: ')) ev.id = Number(line.slice(4));
        if (line.startsWith('data: ')) ev.data = line.slice(6);
      }
      events.push(ev);
      if (onEvent && onEvent(ev, events) === false) return events;
    }
  }
  return events;
}

// The built-in demo's greedy completions of `prompts` (max_tokens each, ignore_eos) from `srv`: one at a time
// (alone), then all at once (batched); with chat, also a streamed greedy chat reply to "Hi". Layouts that split the
// model (tensor parallelism) must give the outputs of one rank.
export async function greedyDemo(srv, prompts, maxTokens, {chat = false} = {}) {
  const client = new OpenAI({baseURL: srv.url + '/v1', apiKey: 'x', maxRetries: 0});
  const ask = (prompt) => client.completions.create({model: 'deepseek-v3-demo', prompt, max_tokens: maxTokens,
                                                     temperature: 0, ignore_eos: true});
  const alone = [];
  for (const p of prompts) alone.push((await ask(p)).choices[0].text);
  const batched = (await Promise.all(prompts.map(ask))).map((r) => r.choices[0].text);
  if (!chat) return {alone, batched};
  const stream = await client.chat.completions.create({model: 'deepseek-v3-demo', stream: true, max_tokens: maxTokens,
                                                       temperature: 0, messages: [{role: 'user', content: 'Hi'}]});
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  return {alone, batched, chat: text};
}
