// What process 0 of a tensor-parallel layout that spans several processes (mpirun, comm/mpi.h) sends the others
// before each thing its own ranks do: a forward step (the batch and the cache's geometry), the engine's KV block
// copies, new run options, or the end. The other processes' ranks then do the same, in the same order, so every
// rank's collectives meet (engine/tensor_parallel.h: TensorParallelModel sends, RunTensorParallelWorker receives).
//
//   StepMessage m = StepMessage::Forward(batch, /*num_blocks=*/512, /*block_size=*/16, DType::kBF16);
//   std::vector<uint8_t> bytes = EncodeStep(m);
//   FATHOM_ASSIGN_OR_RETURN(StepMessage back, DecodeStep(bytes));   // DATA_LOSS if the bytes are not a message
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "model/forward_batch.h"
#include "model/model.h"
#include "model/run_options.h"

namespace fathom {

struct StepMessage {
  enum class Kind : uint8_t { kForward = 1, kCopyBlocks = 2, kRunOptions = 3, kStop = 4 };
  Kind kind = Kind::kStop;
  ForwardBatch batch;      // kForward
  int64_t num_blocks = 0;  // kForward: the KV cache's geometry (each rank keeps its own like it)
  int64_t block_size = 0;
  DType kv_dtype = DType::kF32;
  std::vector<KvBlockCopy> copies;  // kCopyBlocks
  ModelRunOptions run;              // kRunOptions

  static StepMessage Forward(const ForwardBatch& batch, int64_t num_blocks, int64_t block_size, DType kv_dtype);
  static StepMessage CopyBlocks(std::span<const KvBlockCopy> copies);
  static StepMessage RunOptions(const ModelRunOptions& run);
  static StepMessage Stop() { return StepMessage(); }
};

std::vector<uint8_t> EncodeStep(const StepMessage& m);
StatusOr<StepMessage> DecodeStep(std::span<const uint8_t> bytes);

// How the messages travel: process 0 sends, the others receive, in order.
class StepChannel {
 public:
  virtual ~StepChannel() = default;
  virtual Status Send(const StepMessage& m) = 0;
  // The next message; waits as long as it takes (an idle server sends nothing).
  virtual StatusOr<StepMessage> Receive() = 0;
};

}  // namespace fathom
