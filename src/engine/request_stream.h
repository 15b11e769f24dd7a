// What the engine sends back for a request, and the thread-safe stream that carries it.
//
//   std::shared_ptr<RequestStream> stream = *engine.Submit(request);
//   RequestOutput out;
//   while (stream->Next(&out)) {             // blocks; false once every sample has finished
//     print(out.text);                        // incremental: new token ids, text delta, logprobs
//     if (out.finished) log(out.finish_reason, out.timings.ttft);
//   }
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "engine/sampler.h"

namespace fathom {

enum class FinishReason { kNone, kStop, kLength, kAbort, kError };
// "stop", "length", "abort", "error" ("" for kNone), as in the OpenAI API.
std::string_view FinishReasonName(FinishReason reason);

// Per-request timings in seconds, filled in the final output of each sample.
struct RequestTimings {
  double queue_wait = 0.0;  // arrival -> first scheduled
  double prefill = 0.0;     // first scheduled -> first token
  double ttft = 0.0;        // arrival -> first token
  double decode = 0.0;      // first token -> finish
  double detokenize = 0.0;  // time spent detokenizing this sample
  double grammar = 0.0;     // structured output: token masks and grammar advances of this sample
};

struct RequestOutput {
  std::string request_id;
  int32_t index = 0;                   // which of the n samples
  std::vector<int32_t> token_ids;      // tokens new in this output
  std::string text;                    // text new in this output
  std::vector<SampleResult> logprobs;  // one per new token, when requested
  bool finished = false;               // this sample is done
  FinishReason finish_reason = FinishReason::kNone;
  std::string stop_reason;  // the stop string, or the stop token id as text
  Status status;            // non-OK when the request failed (queue timeout, abort reason, model error)
  // Usage, set in final outputs.
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t prompt_cache_hit_tokens = 0;
  int32_t prompt_cache_miss_tokens = 0;
  RequestTimings timings;
};

class RequestStream {
 public:
  RequestStream(std::string request_id, int32_t num_samples)
      : request_id_(std::move(request_id)), open_samples_(num_samples) {}

  const std::string& request_id() const { return request_id_; }
  // Blocks until an output is ready; false when the stream has ended and everything was read.
  bool Next(RequestOutput* out);
  // Non-blocking.
  std::optional<RequestOutput> TryNext();
  // True once every sample has sent its final output (some outputs may still be unread).
  bool finished() const;

  // Called (on the engine thread, outside the stream's lock) after every Push, so that an asynchronous reader can
  // schedule a TryNext() drain instead of blocking in Next(). Called at once when outputs are already queued.
  void SetListener(std::function<void()> listener);

  // Engine side. A finished output closes its sample; the stream ends when every sample is closed.
  void Push(RequestOutput out);

 private:
  std::string request_id_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestOutput> queue_;
  int32_t open_samples_;
  std::function<void()> listener_;
};

}  // namespace fathom
