// `fathom bench`: load-test an OpenAI-compatible server (online), or time the engine in-process with a roofline
// (offline). A comma-separated --concurrency, --request-rate or --batch-size runs one level after another and reports
// them in one table and one chart.
//
//   fathom bench --base-url http://127.0.0.1:8000 --model NAME --input-len 1024 --output-len 128 --concurrency 1,8,32
//   fathom bench --base-url URL --request-rate 8 --burstiness 0.5 --max-concurrency 64 --slo ttft=200ms,tpot=50ms
//   fathom bench --offline --model cfg.json --load-format dummy --batch-size 1,8 --input-len 32 --output-len 8
//
//   CLI::App app;
//   AddBenchCommand(app);   // registers the subcommand and its callback
#pragma once

#include <CLI/CLI.hpp>

namespace fathom {

void AddBenchCommand(CLI::App& app);

}  // namespace fathom
