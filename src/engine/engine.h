// The engine: one thread owns an EngineCore (scheduler, KV cache, model execution, sampling); any thread may
// submit, abort and read stats.
//
//   FATHOM_ASSIGN_OR_RETURN(auto core, EngineCore::Create(*model, backend, config, text));
//   Engine engine(std::move(core));                                  // starts the engine thread
//   FATHOM_ASSIGN_OR_RETURN(auto stream, engine.Submit({.prompt = ids, .sampling = {.max_tokens = 8}}));
//   RequestOutput out;
//   while (stream->Next(&out)) std::cout << out.text;
//   engine.Abort("req-3");                                            // from any thread
//   EngineStats s = engine.Stats();                                   // snapshot after the latest step
//   engine.Shutdown(Engine::ShutdownMode::kDrain);                    // or kAbort; the destructor aborts
//
// Submit fails at once with kResourceExhausted "queue full" when --max-queue-len requests wait, and with
// kInvalidArgument for requests that can never run; later failures (queue timeout, abort) arrive on the stream.
// A model that breaks for good (Model::broken: a tensor-parallel rank failed or hung) fails the engine: the live
// requests end with that error, and Submit answers kUnavailable from then on; failed() reports it (/health).
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "engine/engine_core.h"

namespace fathom {

class Engine {
 public:
  enum class ShutdownMode { kDrain, kAbort };

  explicit Engine(std::unique_ptr<EngineCore> core);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  StatusOr<std::shared_ptr<RequestStream>> Submit(EngineRequest request);
  // Aborts a queued or running request. kNotFound when the id is not live.
  Status Abort(const std::string& id, const std::string& reason = "aborted by the client");
  EngineStats Stats() const;
  // Requests submitted and not yet finished (queued in the inbox, waiting or running): the load a router sees,
  // exact at once after Submit, unlike Stats(), which follows the steps.
  int32_t num_live() const;
  // Called on the engine thread after every step that ran the model, with the stats of that step (metrics, traces).
  // Set it before the first Submit.
  void SetStepObserver(std::function<void(const EngineStats&)> observer);
  // kDrain: refuse new requests and finish the live ones. kAbort: finish them now with `reason`. Joins the thread.
  void Shutdown(ShutdownMode mode, const std::string& reason = "the engine is shutting down");
  // The resolved configuration (max_model_len filled in); immutable, so any thread may read it.
  const EngineConfig& config() const { return core_->config(); }
  // The first model error, if any (the requests of that step failed with it; the engine keeps going).
  Status last_error() const;
  // Why the engine can run no more requests (its model broke for good); OK while it can.
  Status failed() const;

 private:
  void Loop();

  std::unique_ptr<EngineCore> core_;  // touched only by the engine thread once it runs
  const int32_t max_queue_len_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<EngineRequest, std::shared_ptr<RequestStream>>> inbox_;
  std::vector<std::pair<std::string, std::string>> aborts_;
  std::unordered_set<std::string> live_ids_;
  int32_t published_waiting_ = 0;
  EngineStats stats_;
  Status last_error_;
  Status failed_;
  int64_t next_id_ = 0;
  bool accepting_ = true;
  bool stop_ = false;
  bool abort_all_ = false;
  std::string abort_reason_;
  std::function<void(const EngineStats&)> step_observer_;
  std::thread thread_;
};

}  // namespace fathom
