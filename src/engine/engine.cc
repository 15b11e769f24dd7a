#include "engine/engine.h"

#include <fmt/format.h>

#include "core/logging.h"
#include "obs/trace.h"

namespace fathom {

Engine::Engine(std::unique_ptr<EngineCore> core)
    : core_(std::move(core)), max_queue_len_(core_->config().scheduler.max_queue_len) {
  FATHOM_CHECK(core_ != nullptr);
  stats_ = core_->Stats();
  thread_ = std::thread([this] { Loop(); });
}

Engine::~Engine() {
  Shutdown(ShutdownMode::kAbort);
}

StatusOr<std::shared_ptr<RequestStream>> Engine::Submit(EngineRequest request) {
  FATHOM_RETURN_IF_ERROR(core_->Validate(request));  // reads immutable configuration only
  std::shared_ptr<RequestStream> stream;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!accepting_) return UnavailableError("the engine is shutting down");
    if (!failed_.ok()) {
      return UnavailableError(
          fmt::format("the engine has failed and takes no more requests (restart the server): {}", failed_.message()));
    }
    if (request.id.empty()) request.id = fmt::format("req-{}", next_id_++);
    if (live_ids_.count(request.id) != 0) {
      return AlreadyExistsError(fmt::format("request '{}' already exists", request.id));
    }
    const int32_t waiting = published_waiting_ + static_cast<int32_t>(inbox_.size());
    if (max_queue_len_ > 0 && waiting >= max_queue_len_) {
      return sched::QueueFullError(waiting, max_queue_len_);
    }
    if (!request.arrival) request.arrival = sched::SteadyClock::now();
    stream = std::make_shared<RequestStream>(request.id, request.sampling.n);
    live_ids_.insert(request.id);
    inbox_.emplace_back(std::move(request), stream);
  }
  cv_.notify_all();
  return stream;
}

Status Engine::Abort(const std::string& id, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (live_ids_.count(id) == 0) return NotFoundError(fmt::format("no live request '{}'", id));
    aborts_.emplace_back(id, reason);
  }
  cv_.notify_all();
  return OkStatus();
}

void Engine::SetStepObserver(std::function<void(const EngineStats&)> observer) {
  std::lock_guard<std::mutex> lock(mu_);  // the engine thread reads it after taking mu_ in its wait
  step_observer_ = std::move(observer);
}

int32_t Engine::num_live() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int32_t>(live_ids_.size());
}

EngineStats Engine::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

Status Engine::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

Status Engine::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

void Engine::Shutdown(ShutdownMode mode, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    accepting_ = false;
    stop_ = true;
    if (mode == ShutdownMode::kAbort && !abort_all_) {
      abort_all_ = true;
      abort_reason_ = reason;
    }
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Engine::Loop() {
  obs::SetTraceThreadName("engine");
  if (const Status s = core_->MakeBackendCurrent(); !s.ok()) {
    FATHOM_LOG_ERROR("engine thread: {}", s.ToString());  // the steps then fail with the device's error
  }
  for (;;) {
    std::vector<std::pair<EngineRequest, std::shared_ptr<RequestStream>>> inbox;
    std::vector<std::pair<std::string, std::string>> aborts;
    bool stop = false, abort_all = false;
    std::string abort_reason;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !inbox_.empty() || !aborts_.empty() || core_->HasUnfinished(); });
      inbox.swap(inbox_);
      aborts.swap(aborts_);
      stop = stop_;
      abort_all = abort_all_;
      abort_reason = abort_reason_;
    }
    for (auto& [req, stream] : inbox) {
      const std::string id = req.id;
      const int32_t n = req.sampling.n;
      Status s = core_->AddRequest(std::move(req), stream);
      if (!s.ok()) {
        // Rejected after Submit (the queue filled up in between): report on the stream.
        RequestOutput out;
        out.request_id = id;
        out.finished = true;
        out.finish_reason = FinishReason::kError;
        out.status = s;
        for (int32_t i = 0; i < n; ++i) {
          out.index = i;
          stream->Push(out);
        }
        std::lock_guard<std::mutex> lock(mu_);
        live_ids_.erase(id);
      }
    }
    for (const auto& [id, reason] : aborts) core_->Abort(id, CancelledError(reason));
    if (abort_all) core_->AbortAll(CancelledError(abort_reason));
    Status step = OkStatus();
    const int64_t steps_before = core_->Stats().num_steps;
    if (core_->HasUnfinished()) {
      obs::TraceSpan span("step", "engine");
      step = core_->Step();
      if (obs::TracingEnabled()) {
        const EngineStats st = core_->Stats();
        span.Arg("kind", st.last_step_kind).Arg("tokens", st.last_step_tokens).Arg("seqs", st.last_step_seqs);
        obs::TraceCounter("running", "engine", st.num_running);
        obs::TraceCounter("waiting", "engine", st.num_waiting);
      }
    }
    if (!step.ok()) FATHOM_LOG_ERROR("engine step failed: {}", step.ToString());
    Status broken = step.ok() ? OkStatus() : core_->model_broken();
    if (!broken.ok()) {
      // For good: every live request ends now with the cause, rather than one failed step at a time.
      broken = UnavailableError(fmt::format("the model can run no more steps: {}", broken.message()));
      core_->FailAll(broken);
    }
    const std::vector<std::string> finished = core_->TakeFinishedIds();
    const bool idle = !core_->HasUnfinished();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const std::string& id : finished) live_ids_.erase(id);
      stats_ = core_->Stats();
      published_waiting_ = stats_.num_waiting;
      if (!step.ok() && last_error_.ok()) last_error_ = step;
      if (!broken.ok() && failed_.ok()) {
        failed_ = broken;
        FATHOM_LOG_ERROR("the engine has failed and takes no more requests: {}", broken.message());
      }
      if (stop && idle && inbox_.empty()) return;
    }
    if (step_observer_ && stats_.num_steps != steps_before) step_observer_(core_->Stats());
  }
}

}  // namespace fathom
