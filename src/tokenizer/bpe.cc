#include "tokenizer/bpe.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <queue>

#include "tokenizer/utf8.h"

namespace fathom {

void BpeModel::PairMap::Reserve(size_t n) {
  size_t capacity = 16;
  while (capacity < n * 2) capacity <<= 1;
  entries_.assign(capacity, Entry{});
  mask_ = capacity - 1;
}

bool BpeModel::PairMap::Insert(uint64_t key, MergeValue value) {
  size_t slot = Hash(key) & mask_;
  while (true) {
    Entry& e = entries_[slot];
    if (e.key == key) return false;
    if (e.key == kEmpty) {
      e.key = key;
      e.value = value;
      return true;
    }
    slot = (slot + 1) & mask_;
  }
}

void BpeModel::TokenIndex::Reserve(size_t n) {
  size_t capacity = 16;
  while (capacity < n * 2) capacity <<= 1;
  slots_.assign(capacity, 0);
  mask_ = capacity - 1;
}

void BpeModel::TokenIndex::Insert(std::string_view token, int32_t id, const std::vector<std::string>& tokens) {
  const uint64_t h = Hash(token);
  size_t slot = h & mask_;
  const uint64_t entry = (h & 0xFFFFFFFF00000000ull) | (static_cast<uint64_t>(id) + 1);
  while (true) {
    const uint64_t e = slots_[slot];
    if (e == 0 || ((e >> 32) == (h >> 32) && tokens[static_cast<uint32_t>(e) - 1] == token)) {
      slots_[slot] = entry;
      return;
    }
    slot = (slot + 1) & mask_;
  }
}

StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(std::vector<std::pair<std::string, int32_t>> vocab,
                                                     const std::vector<std::pair<std::string, std::string>>& merges,
                                                     Options options) {
  std::unique_ptr<BpeModel> model(new BpeModel());
  model->options_ = std::move(options);
  int32_t max_id = -1;
  for (const auto& [token, id] : vocab) {
    if (id < 0) return InvalidArgumentError(fmt::format("negative id {} for token \"{}\" in the BPE vocab", id, token));
    max_id = std::max(max_id, id);
  }
  model->id_to_token_.resize(static_cast<size_t>(max_id + 1));
  model->has_id_.assign(static_cast<size_t>(max_id + 1), false);
  model->bmp_char_ids_.assign(0x10000, -1);
  model->byte_ids_.fill(-1);
  model->vocab_.Reserve(vocab.size());
  for (auto& [token, id] : vocab) {
    // A repeated token keeps its last id, as a JSON object with a repeated key does.
    const int32_t previous = model->vocab_.Find(token, model->id_to_token_);
    if (previous >= 0 && previous != id) model->has_id_[previous] = false;
    model->id_to_token_[id] = std::move(token);
    model->has_id_[id] = true;
    model->vocab_.Insert(model->id_to_token_[id], id, model->id_to_token_);
  }
  for (size_t id = 0; id < model->id_to_token_.size(); ++id) {
    if (!model->has_id_[id]) continue;
    const std::string& token = model->id_to_token_[id];
    size_t len;
    if (!token.empty()) {
      const char32_t cp = DecodeUtf8(token, 0, &len);
      if (len == token.size() && cp < 0x10000) model->bmp_char_ids_[cp] = static_cast<int32_t>(id);
    }
    if (token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>') {
      unsigned value = 0;
      if (std::sscanf(token.c_str() + 3, "%2X", &value) == 1) model->byte_ids_[value] = static_cast<int32_t>(id);
    }
  }

  const size_t prefix_len = model->options_.continuing_subword_prefix.size();
  model->merges_.Reserve(merges.size());
  std::string merged;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    const int32_t ia = model->vocab_.Find(a, model->id_to_token_);
    const int32_t ib = model->vocab_.Find(b, model->id_to_token_);
    if (ia < 0 || ib < 0) {
      return InvalidArgumentError(
          fmt::format("BPE merge {} (\"{}\" \"{}\") uses a token missing from the vocab", rank, a, b));
    }
    merged.assign(a);
    merged.append(b.size() >= prefix_len ? std::string_view(b).substr(prefix_len) : std::string_view(b));
    const int32_t im = model->vocab_.Find(merged, model->id_to_token_);
    if (im < 0) {
      return InvalidArgumentError(fmt::format("BPE merge {} produces \"{}\", which is not in the vocab", rank, merged));
    }
    model->merges_.Insert(PairKey(ia, ib), {static_cast<int32_t>(rank), im});
  }
  if (model->options_.unk_token) {
    const int32_t unk = model->vocab_.Find(*model->options_.unk_token, model->id_to_token_);
    if (unk < 0) {
      return InvalidArgumentError(fmt::format("unk_token \"{}\" is not in the vocab", *model->options_.unk_token));
    }
    model->unk_id_ = unk;
  }
  return model;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  const int32_t id = vocab_.Find(token, id_to_token_);
  if (id < 0) return std::nullopt;
  return id;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

int32_t BpeModel::CharId(std::string_view word, size_t begin, size_t end) const {
  const bool add_prefix = !options_.continuing_subword_prefix.empty() && begin != 0;
  const bool add_suffix = !options_.end_of_word_suffix.empty() && end == word.size();
  if (!add_prefix && !add_suffix) {
    size_t len;
    const char32_t cp = DecodeUtf8(word, begin, &len);
    if (cp < 0x10000 && len == end - begin) return bmp_char_ids_[cp];
    return vocab_.Find(word.substr(begin, end - begin), id_to_token_);
  }
  std::string s;
  if (add_prefix) s += options_.continuing_subword_prefix;
  s.append(word.substr(begin, end - begin));
  if (add_suffix) s += options_.end_of_word_suffix;
  return vocab_.Find(s, id_to_token_);
}

void BpeModel::MergeWord(std::string_view word, std::vector<int32_t>& ids) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    int32_t len;  // bytes; 0 once merged into its left neighbour
  };
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator<(const Candidate& o) const {  // std::priority_queue pops the largest: invert the order
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap;
  symbols.clear();
  heap.clear();

  auto push_symbol = [&](int32_t id, int32_t len) {
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, len});
  };
  int32_t pending_unk_len = 0;  // bytes of pending unknown characters (fused when fuse_unk)
  auto flush_unk = [&] {
    if (pending_unk_len > 0) push_symbol(*unk_id_, pending_unk_len);
    pending_unk_len = 0;
  };
  for (size_t i = 0; i < word.size();) {
    const size_t len = std::min(Utf8CharLength(static_cast<unsigned char>(word[i])), word.size() - i);
    const int32_t id = CharId(word, i, i + len);
    if (id >= 0) {
      flush_unk();
      push_symbol(id, static_cast<int32_t>(len));
      i += len;
      continue;
    }
    if (options_.byte_fallback) {
      bool all = true;
      for (size_t k = i; k < i + len; ++k) all &= byte_ids_[static_cast<unsigned char>(word[k])] >= 0;
      if (all) {
        flush_unk();
        for (size_t k = i; k < i + len; ++k) push_symbol(byte_ids_[static_cast<unsigned char>(word[k])], 1);
        i += len;
        continue;
      }
    }
    if (unk_id_) {
      if (!options_.fuse_unk) flush_unk();
      pending_unk_len += static_cast<int32_t>(len);
    }
    i += len;
  }
  if (unk_id_) flush_unk();
  if (symbols.empty()) return;
  symbols.back().next = -1;

  const auto n = static_cast<int32_t>(symbols.size());
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (const MergeValue* m = merges_.Find(PairKey(symbols[i].id, symbols[i + 1].id))) {
      heap.push_back({m->rank, i, m->new_id});
    }
  }
  std::make_heap(heap.begin(), heap.end());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.pos];
    if (left.len == 0 || left.next == -1) continue;
    const int32_t right_pos = left.next;
    Symbol& right = symbols[right_pos];
    const MergeValue* current = merges_.Find(PairKey(left.id, right.id));
    if (current == nullptr || current->new_id != top.new_id) continue;  // stale entry
    left.id = top.new_id;
    left.len += right.len;
    left.next = right.next;
    right.len = 0;
    if (left.next >= 0) symbols[left.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const MergeValue* m = merges_.Find(PairKey(symbols[left.prev].id, left.id))) {
        heap.push_back({m->rank, left.prev, m->new_id});
        std::push_heap(heap.begin(), heap.end());
      }
    }
    if (left.next >= 0) {
      if (const MergeValue* m = merges_.Find(PairKey(left.id, symbols[left.next].id))) {
        heap.push_back({m->rank, top.pos, m->new_id});
        std::push_heap(heap.begin(), heap.end());
      }
    }
  }
  for (const Symbol& s : symbols) {
    if (s.len > 0) ids.push_back(s.id);
  }
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    const int32_t id = vocab_.Find(word, id_to_token_);
    if (id >= 0) {
      ids.push_back(id);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordLength;
  if (cacheable) {
    std::shared_lock lock(cache_mutex_, std::try_to_lock);
    if (lock.owns_lock()) {
      const auto it = cache_.find(word);
      if (it != cache_.end()) {
        ids.insert(ids.end(), it->second.begin(), it->second.end());
        return;
      }
    }
  }
  const size_t first = ids.size();
  MergeWord(word, ids);
  if (cacheable) {
    std::unique_lock lock(cache_mutex_, std::try_to_lock);
    if (lock.owns_lock() && cache_.size() < kCacheCapacity) {
      cache_.emplace(std::string(word), std::vector<int32_t>(ids.begin() + static_cast<ptrdiff_t>(first), ids.end()));
    }
  }
}

}  // namespace fathom
