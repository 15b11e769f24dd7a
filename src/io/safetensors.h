// Safetensors checkpoints over mmap: single files and sharded `model.safetensors.index.json` folders.
//
//   FATHOM_ASSIGN_OR_RETURN(auto ckpt, Checkpoint::Open("/models/qwen"));   // a folder or one .safetensors file
//   FATHOM_ASSIGN_OR_RETURN(TensorView w, ckpt->Get("lm_head.weight", DType::kBF16, {vocab, hidden}));
//   for (const std::string& name : ckpt->names()) ...
//
// Every header is validated when opened: JSON shape, known dtypes, shapes whose byte size matches the offsets,
// offsets inside the file, no overlaps. Errors name the file and the tensor. Views point into the mapping and
// stay valid while the Checkpoint lives. The format does not promise alignment (an odd header length or a 1-byte
// tensor before a 2-byte one shifts what follows): a tensor whose bytes are not aligned to its element size is
// copied to aligned memory at open, with a warning, so that no reader ever loads a misaligned float.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace fathom {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets relative to the start of the data section
  uint64_t end = 0;
};

// One memory-mapped .safetensors file.
class SafetensorsFile {
 public:
  static StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Parses `bytes` (a whole file image) without mmap; `path` is used in messages. The bytes must outlive the file.
  static StatusOr<std::unique_ptr<SafetensorsFile>> FromBytes(std::span<const uint8_t> bytes, std::string path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* Find(const std::string& name) const;
  // A read-only view (const_cast'd: callers must not write) of one tensor.
  TensorView View(const SafetensorsEntry& entry) const;

 private:
  SafetensorsFile() = default;
  Status Parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::map<std::string, SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
  std::map<std::string, std::unique_ptr<uint64_t[]>> aligned_copies_;  // by tensor name: the misaligned ones
};

// All the tensors of a checkpoint folder.
class Checkpoint {
 public:
  // `path` is a folder holding model.safetensors or model.safetensors.index.json (plus its shards), or a
  // single .safetensors file.
  static StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& path);

  bool Has(const std::string& name) const { return index_.count(name) != 0; }
  std::vector<std::string> names() const;
  size_t size() const { return index_.size(); }
  // The file that holds `name`, for messages.
  std::string FileOf(const std::string& name) const;

  // The tensor, checked against an expected dtype and shape when given.
  StatusOr<TensorView> Get(const std::string& name, std::optional<DType> dtype = std::nullopt,
                           std::optional<std::vector<int64_t>> shape = std::nullopt) const;
  StatusOr<const SafetensorsEntry*> Entry(const std::string& name) const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> index_;
  std::string root_;
};

// Writes a safetensors file (tests, tools, and dumping tensors for debugging).
struct SafetensorsWriteItem {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;
};
std::vector<uint8_t> SerializeSafetensors(const std::vector<SafetensorsWriteItem>& items,
                                          const std::map<std::string, std::string>& metadata = {});
Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsWriteItem>& items,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace fathom
