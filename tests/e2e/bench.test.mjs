// `fathom bench` against `fathom serve` (the built-in demo model): the report's token counts match the server's
// /metrics counters, and nothing fails.
import {test} from 'node:test';
import assert from 'node:assert/strict';
import {execFileSync} from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import {fathomBin, repoRoot, scrape, startServer, tmpDir} from './lib/fathom.mjs';

test('bench token counts match the server counters, with zero failures', async () => {
  const srv = await startServer(['--access-log', 'off']);
  try {
    const before = await scrape(srv.url);
    const out = path.join(tmpDir('fathom-bench-'), 'result.json');
    execFileSync(fathomBin, ['--log-level', 'warn', 'bench', '--base-url', srv.url, '--num-requests', '6',
                             '--input-len', '12', '--output-len', '5', '--ignore-eos', '--concurrency', '3',
                             '--warmup', '0', '--tokenizer', path.join(repoRoot, 'demo/deepseek-v3-demo'),
                             '--output', out], {stdio: ['ignore', 'pipe', 'pipe'], timeout: 300000});
    const report = JSON.parse(fs.readFileSync(out, 'utf8'));
    const level = report.levels[0];
    assert.equal(level.completed, 6);
    assert.equal(level.failed, 0);
    assert.equal(level.total_output_tokens, 30);
    const after = await scrape(srv.url);
    assert.equal(after.fathom_generation_tokens_total - before.fathom_generation_tokens_total, level.total_output_tokens);
    assert.equal(after['fathom_requests_total{finish_reason="length",status="200"}'] -
                 (before['fathom_requests_total{finish_reason="length",status="200"}'] || 0), 6);
    assert.ok(level.ttft_ms.count === 6 && level.ttft_ms.p99 > 0);
    assert.ok(level.server_timing && level.server_timing.requests === 6, JSON.stringify(level.server_timing));
  } finally {
    assert.equal(await srv.stop(), 0, srv.stderr);
  }
});
