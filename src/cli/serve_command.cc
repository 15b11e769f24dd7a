#include "cli/serve_command.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "cli/cli_util.h"
#include "cli/engine_setup.h"
#include "comm/communicator.h"
#include "core/bytes.h"
#include "core/logging.h"
#include "engine/engine.h"
#include "engine/engine_group.h"
#include "engine/tokenizer_text.h"
#include "obs/trace.h"
#include "server/server.h"
#include "server/server_metrics.h"
#include "tokenizer/chat_template.h"

#ifndef FATHOM_DEMO_DIR
#define FATHOM_DEMO_DIR "demo/deepseek-v3-demo"
#endif

namespace fathom {

namespace {

struct ServeOptions {
  EngineOptions engine;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  std::string prefix_cache_isolation = "per-key";
  std::vector<std::string> served_model_names;
  std::string reasoning_parser = "auto";
  std::string tool_call_parser = "auto";
  bool enable_auto_tool_choice = false;
  std::string chat_template;  // a named template of tokenizer_config.json
  double stream_retention_s = 60;
  double stream_resume_grace_s = 30;
  bool metrics_require_key = false;
  std::string stream_retention_memory = "64MiB";
  double shutdown_grace_s = 30;
  std::string access_log = "-";
  int http_threads = 2;
  int api_threads = 2;
  std::string max_request_bytes = "8MiB";
  std::string max_buffered_request_bytes = "256MiB";
  double header_timeout_s = 10;
  double idle_timeout_s = 60;
  double write_timeout_s = 60;
  std::string trace_file;
  bool reuse_port = false;
  int private_port = 0;
  int data_parallel_size = 1;
  std::string placement_policy = "prefix";
};

// The device of each replica: a list of --data-parallel-size devices as given, or one device for all: "cpu" (every
// replica on the CPU), "cuda" (replica i on cuda:i) or "cuda:K" (every replica on cuda:K, sharing it).
StatusOr<std::vector<std::string>> ReplicaDevices(const std::string& device, int n) {
  std::vector<std::string> list;
  size_t start = 0;
  while (start <= device.size()) {
    const size_t comma = std::min(device.find(',', start), device.size());
    list.push_back(device.substr(start, comma - start));
    start = comma + 1;
  }
  for (const std::string& d : list) {
    if (d.empty()) return InvalidArgumentError(fmt::format("--device '{}': a device is empty", device));
  }
  if (static_cast<int>(list.size()) == n) return list;
  if (list.size() != 1) {
    return InvalidArgumentError(
        fmt::format("--device lists {} devices for --data-parallel-size {}: give one device, "
                    "or one per replica",
                    list.size(), n));
  }
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(list[0] == "cuda" && n > 1 ? fmt::format("cuda:{}", i) : list[0]);
  return out;
}

// Many concurrent streams need many sockets: raise the soft descriptor limit to the hard one, as nginx does.
void RaiseFileLimit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &lim);
  }
}

bool WaitForSignal(const sigset_t& set, double timeout_s, int* signal_out) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout_s);
  ts.tv_nsec = static_cast<long>((timeout_s - static_cast<double>(ts.tv_sec)) * 1e9);
  const int sig = sigtimedwait(&set, nullptr, &ts);
  if (sig > 0) *signal_out = sig;
  return sig > 0;
}

Status Serve(ServeOptions o) {
  // SIGINT/SIGTERM are taken with sigwait by this thread; every thread started from here on inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  RaiseFileLimit();
  // RSS after bursts of large request bodies is kept flat by the HTTP layer (HttpExchange hands free heap pages back
  // after a large request), not by a low M_MMAP_THRESHOLD: mmapping every block over 128 KiB made string-heavy work
  // (a long chat template) 12x slower. MALLOC_MMAP_THRESHOLD_ in the environment still sets one, if wanted.

  FATHOM_ASSIGN_OR_RETURN(const bool demo, UseDemoWithoutModel(o.engine));
  // The demo answers to the DeepSeek API's names too, so that a DeepSeek client works against it unchanged.
  if (demo && o.served_model_names.empty()) {
    o.served_model_names = {"deepseek-v3-demo", "deepseek-chat", "deepseek-reasoner"};
  }
  if (o.served_model_names.empty()) {
    std::filesystem::path p(ModelFolder(o.engine.model));
    std::string name = std::filesystem::weakly_canonical(p).filename().string();
    o.served_model_names.push_back(name.empty() ? "fathom" : name);
  }
  for (const std::string& name : o.served_model_names) {
    if (name.empty()) return InvalidArgumentError("--served-model-name: a name is empty");
  }
  if (o.port < 0 || o.port > 65535) return InvalidArgumentError("--port must be in [0, 65535]");
  if (o.http_threads < 1 || o.http_threads > 64) return InvalidArgumentError("--http-threads must be in [1, 64]");
  if (o.api_threads < 1 || o.api_threads > 64) return InvalidArgumentError("--api-threads must be in [1, 64]");
  if (o.private_port < 0 || o.private_port > 65535) return InvalidArgumentError("--private-port must be in [0, 65535]");
  if (o.private_port != 0 && o.private_port == o.port) {
    return InvalidArgumentError("--private-port must differ from --port");
  }
  if (o.reuse_port && o.port == 0) {
    return InvalidArgumentError("--reuse-port shares one fixed port among processes: give --port too");
  }
  if (o.data_parallel_size < 1 || o.data_parallel_size > 64) {
    return InvalidArgumentError("--data-parallel-size must be in [1, 64]");
  }
  FATHOM_ASSIGN_OR_RETURN(const PlacementPolicy policy, ParsePlacementPolicy(o.placement_policy));
  FATHOM_ASSIGN_OR_RETURN(const std::vector<std::string> devices,
                          ReplicaDevices(o.engine.device, o.data_parallel_size));
  if (!(o.shutdown_grace_s >= 0)) return InvalidArgumentError("--shutdown-grace-s must be >= 0");
  if (!(o.stream_retention_s >= 0)) return InvalidArgumentError("--stream-retention-s must be >= 0");
  if (!(o.stream_resume_grace_s >= 0 && o.stream_resume_grace_s <= 3600)) {
    return InvalidArgumentError("--stream-resume-grace-s must be in [0, 3600]");
  }
  if (o.metrics_require_key && o.api_key.empty() && std::getenv("FATHOM_API_KEY") == nullptr) {
    return InvalidArgumentError("--metrics-require-key needs an API key (--api-key or FATHOM_API_KEY)");
  }
  if (o.api_key.empty()) {
    if (const char* env = std::getenv("FATHOM_API_KEY"); env != nullptr) o.api_key = env;
  }

  server::ServerOptions so;
  so.http.host = o.host;
  so.http.port = static_cast<uint16_t>(o.port);
  so.http.threads = o.http_threads;
  so.work_threads = o.api_threads;
  so.http.reuse_port = o.reuse_port;
  so.handoff_on_drain = o.reuse_port;
  so.private_port = static_cast<uint16_t>(o.private_port);
  FATHOM_ASSIGN_OR_RETURN(int64_t max_body, ParseBytes(o.max_request_bytes, "--max-request-bytes"));
  so.http.max_body_bytes = static_cast<size_t>(max_body);
  FATHOM_ASSIGN_OR_RETURN(int64_t max_buffered,
                          ParseBytes(o.max_buffered_request_bytes, "--max-buffered-request-bytes"));
  if (max_buffered < max_body) {
    return InvalidArgumentError(
        fmt::format("--max-buffered-request-bytes ({}) must be at least --max-request-bytes ({})",
                    o.max_buffered_request_bytes, o.max_request_bytes));
  }
  so.http.max_buffered_request_bytes = static_cast<size_t>(max_buffered);
  so.http.header_timeout_s = o.header_timeout_s;
  so.http.idle_timeout_s = o.idle_timeout_s;
  so.http.write_timeout_s = o.write_timeout_s;
  so.served_model_name = o.served_model_names.front();
  so.served_model_aliases.assign(o.served_model_names.begin() + 1, o.served_model_names.end());
  so.api_key = o.api_key;
  if (o.prefix_cache_isolation == "per-key") {
    so.prefix_cache_isolation = server::ServerOptions::PrefixCacheIsolation::kPerKey;
  } else if (o.prefix_cache_isolation == "shared") {
    so.prefix_cache_isolation = server::ServerOptions::PrefixCacheIsolation::kShared;
  } else {
    return InvalidArgumentError(
        fmt::format("--prefix-cache-isolation: '{}' is not one of per-key, shared", o.prefix_cache_isolation));
  }
  FATHOM_ASSIGN_OR_RETURN(so.reasoning, server::ParseReasoningParser(o.reasoning_parser, &so.reasoning_auto));
  FATHOM_ASSIGN_OR_RETURN(so.tool_format, server::ParseToolCallParser(o.tool_call_parser));
  so.stream_logs.retention_s = o.stream_retention_s;
  so.stream_resume_grace_s = o.stream_resume_grace_s;
  so.metrics_require_key = o.metrics_require_key;
  FATHOM_ASSIGN_OR_RETURN(int64_t retention_bytes, ParseBytes(o.stream_retention_memory, "--stream-retention-memory"));
  so.stream_logs.max_bytes = static_cast<size_t>(retention_bytes);
  so.access_log = o.access_log == "off" ? "" : o.access_log;

  if (LaunchedByMpi()) {
    if (o.data_parallel_size > 1) {
      return InvalidArgumentError("--data-parallel-size with an mpirun launch: start one server per replica instead");
    }
    if (LaunchedRank() > 0) {
      // A tensor-parallel worker process: no HTTP, no engine. It loads its ranks and runs process 0's steps until
      // process 0 stops.
      FATHOM_ASSIGN_OR_RETURN(LoadedModel worker, LoadModelAndTokenizer(o.engine, TokenizerLoad::kNone));
      if (worker.worker == nullptr) return InternalError("an mpirun process other than the first got no worker");
      return RunParallelWorker(*worker.worker);
    }
  }
  if (!o.trace_file.empty()) {
    FATHOM_RETURN_IF_ERROR(obs::StartTracing());
    FATHOM_LOG_INFO("tracing to {} (written at shutdown)", o.trace_file);
  }
  // Listen first, so that /health answers 503 "loading" while the weights load. A process that shares its port
  // (--reuse-port) listens only once ready instead: the kernel hands a listener its share of new connections at
  // once, and during a rolling restart those would be answered 503 while the process next to it could serve them.
  server::ServerMetrics metrics;
  server::OpenAiServer srv(so);
  srv.SetRecordHook([&metrics](const server::RequestRecord& r) { metrics.OnRequest(r); });
  srv.SetMetricsHandler([&metrics] { return metrics.Expose(); });
  srv.SetInternalErrorHook([&metrics](std::string_view where) { metrics.OnInternalError(where); });
  if (!o.reuse_port) {
    FATHOM_RETURN_IF_ERROR(srv.Start());
    FATHOM_LOG_INFO("listening on http://{}:{} (model '{}' loading){}", o.host, srv.port(),
                    fmt::join(o.served_model_names, "', '"),
                    srv.private_port() != 0 ? fmt::format("; private port {}", srv.private_port()) : std::string());
  } else {
    FATHOM_LOG_INFO("loading model '{}'; port {} is shared (--reuse-port), so it is bound once ready",
                    fmt::join(o.served_model_names, "', '"), o.port);
  }

  // One model, KV cache and engine per replica. Replicas that share a device share its --gpu-memory-utilization.
  const int n = o.data_parallel_size;
  std::vector<LoadedModel> models;
  std::vector<std::unique_ptr<EngineCore>> cores;
  EngineConfig ec;
  for (int i = 0; i < n; ++i) {
    EngineOptions eo = o.engine;
    eo.device = devices[static_cast<size_t>(i)];
    eo.gpu_memory_utilization /=
        static_cast<double>(std::count(devices.begin(), devices.end(), devices[static_cast<size_t>(i)]));
    if (n > 1) FATHOM_LOG_INFO("replica {} of {}: loading on {}", i, n, eo.device);
    // Replica 0's tokenizer (the front's) serves every replica, and its EOS ids (which may come from the tokenizer)
    // hold for all.
    FATHOM_ASSIGN_OR_RETURN(LoadedModel m,
                            LoadModelAndTokenizer(eo, i == 0 ? TokenizerLoad::kRequired : TokenizerLoad::kNone));
    const std::vector<int64_t> eos = ec.eos_token_ids;
    FATHOM_ASSIGN_OR_RETURN(ec, MakeEngineConfig(eo, m));
    if (i > 0) ec.eos_token_ids = eos;
    const Tokenizer& tok = models.empty() ? *m.tokenizer : *models.front().tokenizer;
    FATHOM_ASSIGN_OR_RETURN(std::unique_ptr<EngineCore> core,
                            EngineCore::Create(*m.model, *m.backend, ec, TokenizerTextStreams(tok)));
    cores.push_back(std::move(core));
    models.push_back(std::move(m));
  }
  const LoadedModel& m = models.front();
  std::unique_ptr<ChatTemplate> chat;
  if (auto c = ChatTemplate::ForModel(*m.tokenizer, m.config.model_type, o.chat_template); c.ok()) {
    chat = std::move(c).value();
  } else {
    FATHOM_LOG_WARN("no chat template ({}); /v1/chat/completions will answer 400", c.status().message());
  }
  std::vector<std::unique_ptr<Engine>> replicas;
  std::vector<Engine*> replica_ptrs;
  for (auto& core : cores) {
    replicas.push_back(std::make_unique<Engine>(std::move(core)));
    replica_ptrs.push_back(replicas.back().get());
  }
  EngineGroup engines(replica_ptrs, {.policy = policy, .devices = devices});
  metrics.AttachEngines(&engines);
  for (int i = 0; i < n; ++i) {
    replicas[static_cast<size_t>(i)]->SetStepObserver([&metrics, i](const EngineStats& s) { metrics.OnStep(s, i); });
  }
  srv.Attach(
      {.engines = &engines, .tokenizer = m.tokenizer.get(), .chat = chat.get(), .vocab_size = m.config.vocab_size});
  if (o.reuse_port) {
    FATHOM_RETURN_IF_ERROR(srv.Start());
    FATHOM_LOG_INFO("listening on http://{}:{} (shared port){}", o.host, srv.port(),
                    srv.private_port() != 0 ? fmt::format("; private port {}", srv.private_port()) : std::string());
  }
  const EngineStats st = replicas.front()->Stats();
  FATHOM_LOG_INFO("ready: serving '{}' on http://{}:{} | max_model_len {} | KV cache {} blocks of {} tokens{}{}",
                  fmt::join(o.served_model_names, "', '"), o.host, srv.port(), engines.config().scheduler.max_model_len,
                  st.num_blocks, ec.block_size,
                  n > 1 ? fmt::format(" per replica | {} replicas ({}), placement {}", n, fmt::join(devices, ", "),
                                      PlacementPolicyName(policy))
                        : std::string(),
                  o.reuse_port ? " | port shared (SO_REUSEPORT)" : "");

  int sig = 0;
  while (!WaitForSignal(signals, 3600, &sig)) {
  }
  FATHOM_LOG_INFO("{}: draining ({} requests in flight, grace {:.0f} s; a second signal aborts them now)",
                  sig == SIGINT ? "SIGINT" : "SIGTERM", srv.active_requests(), o.shutdown_grace_s);
  srv.BeginDrain();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.shutdown_grace_s);
  bool idle = false;
  while (!(idle = srv.WaitIdle(std::chrono::milliseconds(100)))) {
    if (std::chrono::steady_clock::now() >= deadline) break;
    int again = 0;
    if (WaitForSignal(signals, 0, &again)) break;
  }
  if (!idle) {
    FATHOM_LOG_WARN("aborting {} requests still in flight", srv.active_requests());
    for (auto& e : replicas) e->Shutdown(Engine::ShutdownMode::kAbort, "the server is shutting down");
    srv.WaitIdle(std::chrono::seconds(5));
  }
  for (auto& e : replicas) e->Shutdown(Engine::ShutdownMode::kDrain);
  metrics.AttachEngines(nullptr);
  // Let the last bytes of each response leave before the I/O threads stop.
  const auto flush_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (srv.open_connections() > 0 && std::chrono::steady_clock::now() < flush_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  srv.Stop();
  if (!o.trace_file.empty()) {
    if (Status s = obs::StopTracingToFile(o.trace_file); !s.ok()) {
      FATHOM_LOG_ERROR("writing the trace: {}", s.message());
    } else {
      FATHOM_LOG_INFO("trace written to {}", o.trace_file);
    }
  }
  FATHOM_LOG_INFO("stopped");
  return OkStatus();
}

}  // namespace

void AddServeCommand(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve the OpenAI- and DeepSeek-compatible HTTP API");
  AddEngineOptions(cmd, o->engine, /*model_required=*/false);
  cmd->get_option("--model")->description(
      "Model folder, or a config.json with --load-format dummy (default: the built-in demo model)");

  const std::string http = "HTTP";
  cmd->add_option("--host", o->host, "Address to listen on")->capture_default_str()->group(http);
  cmd->add_option("--port", o->port, "Port to listen on (0: any free port)")->capture_default_str()->group(http);
  cmd->add_option("--api-key", o->api_key,
                  "Require 'Authorization: Bearer KEY' (or set FATHOM_API_KEY); several keys: KEY1,KEY2")
      ->group(http);
  cmd->add_option("--prefix-cache-isolation", o->prefix_cache_isolation,
                  "per-key: clients of different API keys never share prefix-cache blocks (a shared cache shows "
                  "one client whether another's prompt began the same way); shared: they do. A request's "
                  "cache_salt always separates it further")
      ->capture_default_str()
      ->group(http);
  cmd->add_flag("--metrics-require-key", o->metrics_require_key, "GET /metrics needs the API key too (default: open)")
      ->group(http);
  cmd->add_option("--served-model-name", o->served_model_names,
                  "Model names in the API, space- or comma-separated; the first is the main one (default: the folder "
                  "name; the demo: deepseek-v3-demo deepseek-chat deepseek-reasoner)")
      ->delimiter(',')
      ->group(http);
  cmd->add_option("--http-threads", o->http_threads, "I/O threads: they only move bytes")
      ->capture_default_str()
      ->group(http);
  cmd->add_option("--api-threads", o->api_threads,
                  "Threads that parse requests, render chat templates, tokenize and compile grammars (off the I/O "
                  "threads)")
      ->capture_default_str()
      ->group(http);
  cmd->add_flag("--reuse-port", o->reuse_port,
                "Share --port with other fathom processes (SO_REUSEPORT): the kernel spreads new connections among "
                "them, and one that drains hands its new connections to the others")
      ->group(http);
  cmd->add_option("--private-port", o->private_port,
                  "A second port for this process alone, with the same routes (with --reuse-port: a scrape or a "
                  "resume that must reach this process); 0: none")
      ->capture_default_str()
      ->group(http);
  cmd->add_option("--max-request-bytes", o->max_request_bytes, "Largest request body (413 above)")
      ->capture_default_str()
      ->group(http);
  cmd->add_option("--max-buffered-request-bytes", o->max_buffered_request_bytes,
                  "Request bodies being received at once, over all connections (503 above)")
      ->capture_default_str()
      ->group(http);
  cmd->add_option("--header-timeout-s", o->header_timeout_s, "Time to receive a request (408 after)")
      ->capture_default_str()
      ->group(http);
  cmd->add_option("--idle-timeout-s", o->idle_timeout_s, "Keep-alive idle time")->capture_default_str()->group(http);
  cmd->add_option("--write-timeout-s", o->write_timeout_s, "Longest single write to a slow client")
      ->capture_default_str()
      ->group(http);
  cmd->add_option("--trace-file", o->trace_file,
                  "Write a Chrome/Perfetto trace of engine steps and requests to FILE at shutdown")
      ->group(http);
  cmd->add_option("--access-log", o->access_log, "JSON-lines access log: a file, - (stdout) or off")
      ->capture_default_str()
      ->group(http);

  const std::string api = "API";
  cmd->add_option("--reasoning-parser", o->reasoning_parser,
                  "auto | deepseek-r1 | none: text up to </think> becomes reasoning_content (auto: when the chat "
                  "template opens a <think> block)")
      ->capture_default_str()
      ->group(api);
  cmd->add_option("--tool-call-parser", o->tool_call_parser,
                  "auto | deepseek_v3 | deepseek_v31 | deepseek_v32 | deepseek_v4 | hermes | llama3_json | none: the "
                  "format of tool calls in the model's output (auto: the one its chat template writes)")
      ->capture_default_str()
      ->group(api);
  cmd->add_flag("--enable-auto-tool-choice", o->enable_auto_tool_choice,
                "Accepted for vLLM's command lines: tool_choice auto is on whenever the tool-call format is known")
      ->group(api);
  cmd->add_option("--chat-template", o->chat_template,
                  "A named chat template of tokenizer_config.json, or deepseek_v32 / deepseek_v4 (the built-in "
                  "DeepSeek-V3.2 / V4 encodings, picked by themselves for such a checkpoint without a template)")
      ->group(api);
  cmd->add_option("--stream-retention-s", o->stream_retention_s,
                  "How long the events of a finished stream stay resumable (GET /v1/streams/{id})")
      ->capture_default_str()
      ->group(api);
  cmd->add_option("--stream-retention-memory", o->stream_retention_memory, "Memory for resumable streams")
      ->capture_default_str()
      ->group(api);
  cmd->add_option("--stream-resume-grace-s", o->stream_resume_grace_s,
                  "A stream that opted into resuming (stream_options.resumable) keeps generating this long after "
                  "its client drops, for a resume to pick it up")
      ->capture_default_str()
      ->group(api);
  const std::string dp = "Data parallel";
  cmd->add_option("--data-parallel-size", o->data_parallel_size,
                  "Engine replicas behind this server, each with its own model copy and KV cache: replica i on "
                  "cuda:i with --device cuda, all on one device with --device cuda:K or cpu, or a comma-separated "
                  "list of devices")
      ->capture_default_str()
      ->group(dp);
  cmd->add_option("--placement-policy", o->placement_policy,
                  "Where a request goes among the replicas: prefix (the one that likely caches the longest prefix of "
                  "the prompt, else the least loaded), least-loaded, or round-robin")
      ->capture_default_str()
      ->group(dp);
  cmd->add_option("--shutdown-grace-s", o->shutdown_grace_s,
                  "On SIGTERM/SIGINT: how long in-flight requests may finish before they are aborted")
      ->capture_default_str()
      ->group(api);
  cmd->callback([o] { ExitOnError(Serve(*o)); });
}

}  // namespace fathom
