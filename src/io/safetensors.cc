#include "io/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/json.h"
#include "core/logging.h"

namespace fathom {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the format's own limit is 100 MB

Status Corrupt(const std::string& path, const std::string& what) {
  return DataLossError(fmt::format("safetensors file '{}': {}", path, what));
}

}  // namespace

SafetensorsFile::~SafetensorsFile() {
  if (mapped_ && base_ != nullptr) munmap(const_cast<uint8_t*>(base_), size_);
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFoundError(fmt::format("cannot open safetensors file '{}': {}", path, std::strerror(errno)));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgumentError(fmt::format("'{}' is not a regular file", path));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ > 0) {
    void* p = mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      return InternalError(fmt::format("mmap of '{}' failed: {}", path, std::strerror(errno)));
    }
    file->base_ = static_cast<const uint8_t*>(p);
    file->mapped_ = true;
  }
  ::close(fd);
  FATHOM_RETURN_IF_ERROR(file->Parse());
  return file;
}

StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBytes(std::span<const uint8_t> bytes,
                                                                      std::string path) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = std::move(path);
  file->base_ = bytes.data();
  file->size_ = bytes.size();
  FATHOM_RETURN_IF_ERROR(file->Parse());
  return file;
}

Status SafetensorsFile::Parse() {
  if (size_ < 8) return Corrupt(path_, fmt::format("file is {} bytes, too short for the 8-byte header length", size_));
  uint64_t header_len = 0;
  std::memcpy(&header_len, base_, 8);  // little-endian on every platform we build for
  if (header_len > kMaxHeaderBytes) {
    return Corrupt(path_, fmt::format("header length {} exceeds the {} byte limit", header_len, kMaxHeaderBytes));
  }
  if (header_len > size_ - 8) {
    return Corrupt(
        path_, fmt::format("header length {} runs past the end of the {}-byte file (truncated?)", header_len, size_));
  }
  const char* hdr = reinterpret_cast<const char*>(base_ + 8);
  json j = json::parse(hdr, hdr + header_len, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Corrupt(path_, "header is not valid JSON");
  if (!j.is_object()) return Corrupt(path_, "header is not a JSON object");
  data_ = base_ + 8 + header_len;
  const uint64_t data_size = size_ - 8 - header_len;

  std::vector<const SafetensorsEntry*> by_offset;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return Corrupt(path_, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          return Corrupt(path_, fmt::format("__metadata__ value '{}' is not a string", m.key()));
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) { return Corrupt(path_, fmt::format("tensor '{}': {}", name, what)); };
    if (!v.is_object()) return bad("entry is not an object");
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) return bad("missing or non-string 'dtype'");
    if (sh == v.end() || !sh->is_array()) return bad("missing or non-array 'shape'");
    if (off == v.end() || !off->is_array() || off->size() != 2) return bad("'data_offsets' must be [begin, end]");
    StatusOr<DType> dtype = DTypeFromSafetensors(dt->get<std::string>());
    if (!dtype.ok()) return bad(dtype.status().message());
    SafetensorsEntry e;
    e.name = name;
    e.dtype = *dtype;
    if (sh->size() > static_cast<size_t>(kMaxDims))
      return bad(fmt::format("{} dimensions (at most {})", sh->size(), kMaxDims));
    uint64_t numel = 1;
    for (const json& d : *sh) {
      if (!d.is_number_unsigned()) return bad("shape holds a value that is not a non-negative integer");
      const uint64_t dv = d.get<uint64_t>();
      if (dv > (1ull << 40) || (dv != 0 && numel > std::numeric_limits<uint64_t>::max() / 4 / dv)) {
        return bad("shape is too large");
      }
      numel *= dv;
      e.shape.push_back(static_cast<int64_t>(dv));
    }
    for (const json& o : *off) {
      if (!o.is_number_unsigned()) return bad("data_offsets holds a value that is not a non-negative integer");
    }
    e.begin = (*off)[0].get<uint64_t>();
    e.end = (*off)[1].get<uint64_t>();
    if (e.begin > e.end) return bad(fmt::format("data_offsets [{}, {}] are reversed", e.begin, e.end));
    if (e.end > data_size) {
      return bad(fmt::format("data_offsets [{}, {}] run past the {}-byte data section (truncated file?)", e.begin,
                             e.end, data_size));
    }
    const uint64_t want = numel * DTypeSize(e.dtype);
    if (e.end - e.begin != want) {
      return bad(fmt::format("holds {} bytes but dtype {} and shape need {}", e.end - e.begin,
                             DTypeSafetensorsName(e.dtype), want));
    }
    auto [pos, inserted] = entries_.emplace(name, std::move(e));
    if (!inserted) return bad("appears twice");
    by_offset.push_back(&pos->second);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const SafetensorsEntry* prev = by_offset[i - 1];
    const SafetensorsEntry* cur = by_offset[i];
    if (cur->begin < prev->end) {
      return Corrupt(path_, fmt::format("tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", prev->name, prev->begin,
                                        prev->end, cur->name, cur->begin, cur->end));
    }
  }
  // Misaligned tensors (legal in the format, rare from real writers) get an aligned copy: readers cast the bytes to
  // uint16_t/float pointers, and a misaligned load is undefined behaviour (and a fault on some targets).
  uint64_t copied_bytes = 0;
  for (const auto& [name, e] : entries_) {
    const uint64_t bytes = e.end - e.begin;
    if (bytes == 0 || reinterpret_cast<uintptr_t>(data_ + e.begin) % DTypeSize(e.dtype) == 0) continue;
    auto copy = std::make_unique_for_overwrite<uint64_t[]>((bytes + 7) / 8);
    std::memcpy(copy.get(), data_ + e.begin, bytes);
    aligned_copies_.emplace(name, std::move(copy));
    copied_bytes += bytes;
  }
  if (!aligned_copies_.empty()) {
    FATHOM_LOG_WARN(
        "'{}': {} tensor(s) are not aligned to their element size in the file; copied {:.1f} MiB to "
        "aligned memory (re-save the checkpoint with a current safetensors to avoid this)",
        path_, aligned_copies_.size(), static_cast<double>(copied_bytes) / (1 << 20));
  }
  return OkStatus();
}

const SafetensorsEntry* SafetensorsFile::Find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

TensorView SafetensorsFile::View(const SafetensorsEntry& e) const {
  if (auto it = aligned_copies_.find(e.name); it != aligned_copies_.end()) {
    return TensorView(reinterpret_cast<uint8_t*>(it->second.get()), e.dtype, std::span<const int64_t>(e.shape));
  }
  return TensorView(const_cast<uint8_t*>(data_ + e.begin), e.dtype, std::span<const int64_t>(e.shape));
}

StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& path) {
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  std::error_code ec;
  std::vector<std::string> files;
  if (fs::is_regular_file(path, ec)) {
    ckpt->root_ = fs::path(path).parent_path().string();
    files.push_back(path);
  } else if (fs::is_directory(path, ec)) {
    ckpt->root_ = path;
    const fs::path index_path = fs::path(path) / "model.safetensors.index.json";
    const fs::path single = fs::path(path) / "model.safetensors";
    if (fs::exists(index_path, ec)) {
      std::ifstream in(index_path);
      json idx = json::parse(in, nullptr, false);
      if (idx.is_discarded() || !idx.is_object()) {
        return DataLossError(fmt::format("'{}' is not a valid JSON object", index_path.string()));
      }
      auto wm = idx.find("weight_map");
      if (wm == idx.end() || !wm->is_object()) {
        return DataLossError(fmt::format("'{}' has no 'weight_map' object", index_path.string()));
      }
      std::map<std::string, std::vector<std::string>> expected;  // shard -> tensors it should hold
      for (auto it = wm->begin(); it != wm->end(); ++it) {
        if (!it.value().is_string()) {
          return DataLossError(
              fmt::format("'{}': weight_map entry '{}' is not a file name", index_path.string(), it.key()));
        }
        const std::string shard = it.value().get<std::string>();
        if (shard.empty() || shard.find('/') != std::string::npos || shard.find("..") != std::string::npos) {
          return DataLossError(fmt::format("'{}': tensor '{}' maps to an invalid shard name '{}'", index_path.string(),
                                           it.key(), shard));
        }
        expected[shard].push_back(it.key());
      }
      for (auto& [shard, names] : expected) {
        const std::string shard_path = (fs::path(path) / shard).string();
        FATHOM_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(shard_path));
        for (const std::string& n : names) {
          if (file->Find(n) == nullptr) {
            return DataLossError(fmt::format("tensor '{}' is listed in '{}' under '{}' but that file does not hold it",
                                             n, index_path.string(), shard_path));
          }
          ckpt->index_[n] = file.get();
        }
        ckpt->files_.push_back(std::move(file));
      }
      return ckpt;
    } else if (fs::exists(single, ec)) {
      files.push_back(single.string());
    } else {
      // Some checkpoints name a single shard differently: take every .safetensors file in the folder.
      for (const auto& de : fs::directory_iterator(path, ec)) {
        if (de.path().extension() == ".safetensors") files.push_back(de.path().string());
      }
      std::sort(files.begin(), files.end());
      if (files.empty()) {
        return NotFoundError(
            fmt::format("no model.safetensors, model.safetensors.index.json or *.safetensors in '{}'", path));
      }
    }
  } else {
    return NotFoundError(fmt::format("checkpoint path '{}' does not exist", path));
  }
  for (const std::string& f : files) {
    FATHOM_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(f));
    for (const auto& [name, e] : file->entries()) {
      auto [it, inserted] = ckpt->index_.emplace(name, file.get());
      if (!inserted) {
        return DataLossError(fmt::format("tensor '{}' appears in both '{}' and '{}'", name, it->second->path(), f));
      }
    }
    ckpt->files_.push_back(std::move(file));
  }
  return ckpt;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [n, f] : index_) out.push_back(n);
  return out;
}

std::string Checkpoint::FileOf(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? root_ : it->second->path();
}

StatusOr<const SafetensorsEntry*> Checkpoint::Entry(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return NotFoundError(fmt::format("tensor '{}' is missing from checkpoint '{}'", name, root_));
  return it->second->Find(name);
}

StatusOr<TensorView> Checkpoint::Get(const std::string& name, std::optional<DType> dtype,
                                     std::optional<std::vector<int64_t>> shape) const {
  FATHOM_ASSIGN_OR_RETURN(const SafetensorsEntry* e, Entry(name));
  const SafetensorsFile* file = index_.at(name);
  if (dtype && e->dtype != *dtype) {
    return InvalidArgumentError(fmt::format("tensor '{}' in '{}' has dtype {}, expected {}", name, file->path(),
                                            DTypeSafetensorsName(e->dtype), DTypeSafetensorsName(*dtype)));
  }
  if (shape && e->shape != *shape) {
    return InvalidArgumentError(fmt::format("tensor '{}' in '{}' has shape [{}], expected [{}]", name, file->path(),
                                            fmt::join(e->shape, ", "), fmt::join(*shape, ", ")));
  }
  return file->View(*e);
}

std::vector<uint8_t> SerializeSafetensors(const std::vector<SafetensorsWriteItem>& items,
                                          const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& it : items) {
    header[it.name] = {{"dtype", std::string(DTypeSafetensorsName(it.dtype))},
                       {"shape", it.shape},
                       {"data_offsets", {offset, offset + it.bytes.size()}}};
    offset += it.bytes.size();
  }
  std::string h = JsonText(header);
  while ((h.size() + 8) % 8 != 0) h.push_back(' ');  // the format pads the header with spaces to 8-byte alignment
  std::vector<uint8_t> out(8 + h.size());
  const uint64_t hl = h.size();
  std::memcpy(out.data(), &hl, 8);
  std::memcpy(out.data() + 8, h.data(), h.size());
  for (const auto& it : items) out.insert(out.end(), it.bytes.begin(), it.bytes.end());
  return out;
}

Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsWriteItem>& items,
                        const std::map<std::string, std::string>& metadata) {
  std::vector<uint8_t> bytes = SerializeSafetensors(items, metadata);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return InternalError(fmt::format("cannot write '{}'", path));
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) return InternalError(fmt::format("short write to '{}'", path));
  return OkStatus();
}

}  // namespace fathom
