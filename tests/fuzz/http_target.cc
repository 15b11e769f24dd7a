// FuzzHttp: raw bytes -> Beast's request parser -> OpenAiServer::Dispatch -> the engine, and back.
#include <fmt/format.h>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "backend/cpu/cpu_backend.h"
#include "core/logging.h"
#include "engine/engine.h"
#include "engine/engine_group.h"
#include "engine/tokenizer_text.h"
#include "fuzz_targets.h"
#include "io/model_config.h"
#include "model/model.h"
#include "server/server.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace fathom::fuzz {
namespace {

namespace http = boost::beast::http;

// A model without weights: each logits row favours a token that depends on the position, and EOS at three of every
// eight positions, so that generations are short but not trivial. The engine, sampler and detokenizer around it are
// the real ones.
class PositionModel final : public Model {
 public:
  PositionModel(ModelConfig cfg, int32_t eos, Backend& backend) : cfg_(std::move(cfg)), eos_(eos), backend_(backend) {}
  const ModelConfig& config() const override { return cfg_; }
  KvCacheSpec kv_cache_spec() const override {
    return {.num_layers = 1, .num_kv_heads = 1, .k_dim = 4, .v_dim = 4, .v_in_k = false};
  }
  Status Forward(const ForwardBatch& batch, KvCache& kv, Tensor* logits) override {
    FATHOM_RETURN_IF_ERROR(CheckForwardInputs(batch, kv, kv_cache_spec(), cfg_.vocab_size));
    *logits = backend_.Alloc(DType::kF32, {batch.num_logits(), cfg_.vocab_size});  // [n_logits, vocab], zeroed
    float* out = logits->view().data<float>();
    for (int64_t i = 0; i < batch.num_logits(); ++i) {
      const int32_t pos = batch.positions[static_cast<size_t>(batch.logits_indices[static_cast<size_t>(i)])];
      const int32_t token = pos % 8 >= 5 ? eos_ : static_cast<int32_t>((pos * 7919) % cfg_.vocab_size);
      out[i * cfg_.vocab_size + token] = 30.0f;
    }
    return OkStatus();
  }

 private:
  ModelConfig cfg_;
  int32_t eos_;
  Backend& backend_;
};

// The model's config: a small Llama whose vocabulary is the tokenizer's.
constexpr const char* kConfig = R"({{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "vocab_size": {}, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
  "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
  "rope_theta": 10000, "bos_token_id": 0, "eos_token_id": {}, "torch_dtype": "bfloat16"}})";

// What an exchange wrote, and whether its response is complete.
class CaptureSink final : public server::HttpSink {
 public:
  void Write(std::string bytes, bool complete, bool /*close_after*/) override {
    std::lock_guard<std::mutex> lock(mu_);
    out_ += bytes;
    if (complete) {
      done_ = true;
      cv_.notify_all();
    }
  }
  bool WaitDone(std::chrono::seconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return done_; });
  }
  std::string out() {
    std::lock_guard<std::mutex> lock(mu_);
    return out_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::string out_;
  bool done_ = false;
};

void Die(const char* what) {
  std::fprintf(stderr, "FuzzHttp: %s\n", what);
  __builtin_trap();
}

// One server, engine and tokenizer for the whole process (as in `fathom serve`); built on first use. The tokenizer is
// DeepSeek-V3's cut down to ~600 ids, with its real chat template (tests/fuzz/make_corpus.py writes it), so that
// sampling a step costs little.
struct Served {
  server::HttpOptions http;
  CpuBackend backend;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatTemplate> chat;
  std::unique_ptr<PositionModel> model;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<EngineGroup> engines;
  std::unique_ptr<server::OpenAiServer> server;
  int64_t vocab = 0;
  std::string last_stream_id = "none";

  Served() {
    SetLogLevel(LogLevel::kOff);
    const char* dir_env = std::getenv("FATHOM_FUZZ_TOKENIZER_DIR");
    const std::string dir = dir_env != nullptr ? dir_env : FATHOM_TEST_DATA_DIR "/fuzz/http-tokenizer";
    auto tok = Tokenizer::FromDirectory(dir);
    if (!tok.ok()) Die("no tokenizer in tests/data/fuzz/http-tokenizer (or $FATHOM_FUZZ_TOKENIZER_DIR)");
    tokenizer = std::move(tok).value();
    auto c = ChatTemplate::FromTokenizer(*tokenizer);
    if (!c.ok()) Die("no chat template");
    chat = std::move(c).value();
    const std::optional<int32_t> eos = tokenizer->TokenToId("<｜end▁of▁sentence｜>");
    if (!eos) Die("the tokenizer has no <｜end▁of▁sentence｜>");
    vocab = static_cast<int64_t>(tokenizer->vocab_size());
    auto cfg = ParseModelConfigText(fmt::format(kConfig, vocab, *eos));
    if (!cfg.ok()) Die("bad model config");
    model = std::make_unique<PositionModel>(*cfg, *eos, backend);
    EngineConfig ec;
    ec.scheduler.max_model_len = 96;
    ec.scheduler.max_num_seqs = 8;
    ec.scheduler.max_num_batched_tokens = 256;
    ec.scheduler.max_queue_len = 16;
    ec.num_blocks = 64;
    ec.block_size = 16;
    ec.eos_token_ids = {*eos};
    ec.seed = 1;
    auto core = EngineCore::Create(*model, backend, ec, TokenizerTextStreams(*tokenizer));
    if (!core.ok()) Die("no engine");
    engine = std::make_unique<Engine>(std::move(core).value());

    server::ServerOptions o;
    o.http.port = 0;
    o.http.threads = 2;
    o.http.max_body_bytes = 1 << 20;
    http = o.http;
    o.access_log = "";
    o.api_key = "fuzz-key";
    o.stream_logs.max_bytes = 4 << 20;
    o.stream_resume_grace_s = 0.05;
    server = std::make_unique<server::OpenAiServer>(o);
    server->SetMetricsHandler([] { return std::string("fathom_up 1\n"); });
    if (!server->Start().ok()) Die("the server did not start");
    engines = std::make_unique<EngineGroup>(std::vector<Engine*>{engine.get()});
    server->Attach({.engines = engines.get(), .tokenizer = tokenizer.get(), .chat = chat.get(), .vocab_size = vocab});
  }
};

Served& TheServer() {
  static Served* s = new Served();  // never destroyed: the engine and I/O threads live as long as the process
  return *s;
}

// Handles one parsed request as a connection would, and checks the answer.
void Exchange(Served& s, server::HttpRequest req) {
  if (req.target() == "/v1/streams/LAST") req.target("/v1/streams/" + s.last_stream_id);
  // A trace capture lasts as long as asked (up to 60 s): keep the fuzzer's short.
  if (req.target().starts_with("/debug/trace")) req.target("/debug/trace?seconds=0.01");
  const auto start = std::chrono::steady_clock::now();
  auto sink = std::make_shared<CaptureSink>();
  auto ex = std::make_shared<server::HttpExchange>(sink, std::move(req), "fuzz");
  s.server->Dispatch(ex);
  if (!sink->WaitDone(std::chrono::seconds(10))) Die("no complete response within 10 s");
  const std::string out = sink->out();
  static const bool verbose = std::getenv("FATHOM_FUZZ_VERBOSE") != nullptr;  // what each request was answered
  if (verbose) {
    std::fprintf(stderr, "--- %.3f s: %s\n",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                 out.substr(0, 600).c_str());
  }
  if (out.empty()) return;  // abandoned: nothing to answer (a closed client)
  if (out.rfind("HTTP/1.1 ", 0) != 0) Die("the response does not start with a status line");
  if (out.compare(9, 3, "500") == 0) Die("a 500: an exception reached the barrier");
  if (s.server->internal_errors() != 0) Die("the exception barrier caught something");
  const size_t id = out.find("X-Fathom-Stream-Id: ");
  if (id != std::string::npos && id < out.find("\r\n\r\n")) {
    const size_t begin = id + 20;
    s.last_stream_id = out.substr(begin, out.find("\r\n", begin) - begin);
  }
}

}  // namespace

int FuzzHttp(const uint8_t* data, size_t size) {
  Served& s = TheServer();
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  // Pipelined requests, as a keep-alive connection reads them; a malformed one ends the connection (the session
  // answers 400/413/431 without calling the handler).
  for (int n = 0; n < 8 && !rest.empty(); ++n) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(s.http.max_body_bytes);
    parser.header_limit(static_cast<std::uint32_t>(s.http.max_header_bytes));
    parser.eager(true);
    boost::beast::error_code ec;
    size_t used = 0;
    while (!parser.is_done()) {
      if (used >= rest.size()) {  // the input ends here: the peer closed the connection
        parser.put_eof(ec);
        break;
      }
      const size_t got = parser.put(boost::asio::buffer(rest.data() + used, rest.size() - used), ec);
      used += got;
      if (ec == http::error::need_more) ec = {};
      if (ec) break;
      if (got == 0) {  // it needs more than the input holds
        parser.put_eof(ec);
        break;
      }
    }
    if (ec || !parser.is_done()) return 0;
    rest.remove_prefix(used);
    const bool keep_alive = parser.get().keep_alive();
    Exchange(s, parser.release());
    if (!keep_alive) break;
  }
  return 0;
}

}  // namespace fathom::fuzz
