#include "engine/step_message.h"

#include <fmt/format.h>

#include <cstring>

namespace fathom {

namespace {

constexpr uint32_t kMagic = 0x66745331;  // "ftS1": the format's version

class Writer {
 public:
  template <typename T>
  void Put(T v) {
    const size_t at = out.size();
    out.resize(at + sizeof(T));
    std::memcpy(out.data() + at, &v, sizeof(T));
  }
  void Put(const std::vector<int32_t>& v) {
    Put<uint64_t>(v.size());
    const size_t at = out.size();
    out.resize(at + v.size() * sizeof(int32_t));
    if (!v.empty()) std::memcpy(out.data() + at, v.data(), v.size() * sizeof(int32_t));
  }
  std::vector<uint8_t> out;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> in) : in_(in) {}
  template <typename T>
  bool Get(T* v) {
    if (in_.size() - at_ < sizeof(T)) return false;
    std::memcpy(v, in_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  bool Get(std::vector<int32_t>* v) {
    uint64_t n = 0;
    if (!Get(&n) || n > (in_.size() - at_) / sizeof(int32_t)) return false;
    v->resize(n);
    if (n > 0) std::memcpy(v->data(), in_.data() + at_, n * sizeof(int32_t));
    at_ += n * sizeof(int32_t);
    return true;
  }
  bool done() const { return at_ == in_.size(); }

 private:
  std::span<const uint8_t> in_;
  size_t at_ = 0;
};

}  // namespace

StepMessage StepMessage::Forward(const ForwardBatch& batch, int64_t num_blocks, int64_t block_size, DType kv_dtype) {
  StepMessage m;
  m.kind = Kind::kForward;
  m.batch = batch;
  m.num_blocks = num_blocks;
  m.block_size = block_size;
  m.kv_dtype = kv_dtype;
  return m;
}

StepMessage StepMessage::CopyBlocks(std::span<const KvBlockCopy> copies) {
  StepMessage m;
  m.kind = Kind::kCopyBlocks;
  m.copies.assign(copies.begin(), copies.end());
  return m;
}

StepMessage StepMessage::RunOptions(const ModelRunOptions& run) {
  StepMessage m;
  m.kind = Kind::kRunOptions;
  m.run = run;
  return m;
}

std::vector<uint8_t> EncodeStep(const StepMessage& m) {
  Writer w;
  w.Put(kMagic);
  w.Put(static_cast<uint8_t>(m.kind));
  switch (m.kind) {
    case StepMessage::Kind::kForward: {
      const ForwardBatch& b = m.batch;
      w.Put(b.block_size);
      for (const std::vector<int32_t>* v :
           {&b.token_ids, &b.positions, &b.slot_mapping, &b.query_start, &b.seq_lens, &b.block_table_start,
            &b.block_tables, &b.logits_indices, &b.window_slot_mapping, &b.window_block_table_start,
            &b.window_block_tables}) {
        w.Put(*v);
      }
      w.Put(m.num_blocks);
      w.Put(m.block_size);
      w.Put(static_cast<uint8_t>(m.kv_dtype));
      break;
    }
    case StepMessage::Kind::kCopyBlocks: {
      std::vector<int32_t> flat;
      for (const KvBlockCopy& c : m.copies) {
        flat.push_back(c.src);
        flat.push_back(c.dst);
        flat.push_back(c.group);
      }
      w.Put(flat);
      break;
    }
    case StepMessage::Kind::kRunOptions:
      w.Put(m.run.max_batched_tokens);
      w.Put(static_cast<uint8_t>(m.run.prefill_form));
      break;
    case StepMessage::Kind::kStop:
      break;
  }
  return std::move(w.out);
}

StatusOr<StepMessage> DecodeStep(std::span<const uint8_t> bytes) {
  Reader r(bytes);
  uint32_t magic = 0;
  uint8_t kind = 0;
  const Status bad =
      DataLossError(fmt::format("a tensor-parallel step message of {} bytes is malformed", bytes.size()));
  if (!r.Get(&magic) || magic != kMagic || !r.Get(&kind)) return bad;
  StepMessage m;
  m.kind = static_cast<StepMessage::Kind>(kind);
  switch (m.kind) {
    case StepMessage::Kind::kForward: {
      ForwardBatch& b = m.batch;
      b.query_start.clear();
      b.block_table_start.clear();
      if (!r.Get(&b.block_size)) return bad;
      for (std::vector<int32_t>* v : {&b.token_ids, &b.positions, &b.slot_mapping, &b.query_start, &b.seq_lens,
                                      &b.block_table_start, &b.block_tables, &b.logits_indices, &b.window_slot_mapping,
                                      &b.window_block_table_start, &b.window_block_tables}) {
        if (!r.Get(v)) return bad;
      }
      uint8_t dtype = 0;
      if (!r.Get(&m.num_blocks) || !r.Get(&m.block_size) || !r.Get(&dtype)) return bad;
      if (dtype > static_cast<uint8_t>(DType::kU8)) return bad;
      m.kv_dtype = static_cast<DType>(dtype);
      break;
    }
    case StepMessage::Kind::kCopyBlocks: {
      std::vector<int32_t> flat;
      if (!r.Get(&flat) || flat.size() % 3 != 0) return bad;
      for (size_t i = 0; i < flat.size(); i += 3) {
        if (flat[i + 2] != 0 && flat[i + 2] != 1) return bad;
        m.copies.push_back({flat[i], flat[i + 1], flat[i + 2]});
      }
      break;
    }
    case StepMessage::Kind::kRunOptions: {
      uint8_t prefill = 0;
      if (!r.Get(&m.run.max_batched_tokens) || !r.Get(&prefill) ||
          prefill > static_cast<uint8_t>(PrefillForm::kCompact)) {
        return bad;
      }
      m.run.prefill_form = static_cast<PrefillForm>(prefill);
      break;
    }
    case StepMessage::Kind::kStop:
      break;
    default:
      return bad;
  }
  if (!r.done()) return bad;
  return m;
}

}  // namespace fathom
