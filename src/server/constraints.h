// Structured-output constraints for the server: a ConstraintSpec (api.h) compiled into a grammar at the model's
// vocabulary, on the API thread that parsed the request (never the engine thread), and cached by spec so that the
// requests of one schema share one grammar and its masks.
//
//   ConstraintCompiler compiler(tokenizer, eos_ids);
//   StatusOr<std::shared_ptr<grammar::GrammarCache>> g = compiler.Get(*req.constraint);  // kInvalidArgument: a 400
//   sampling.grammar = *g;
#pragma once

#include <atomic>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "grammar/matcher.h"
#include "server/api.h"

namespace fathom {

class Tokenizer;

class ConstraintCompiler {
 public:
  // `eos_ids`: the engine's end tokens, which a finished grammar allows. The vocabulary is built on first use.
  ConstraintCompiler(const Tokenizer* tokenizer, std::vector<int64_t> eos_ids, size_t capacity = 64);

  // A flag that, once set, stops compiles in progress (Get answers kUnavailable): the server's shutdown.
  void SetCancelFlag(const std::atomic<bool>* cancel) { cancel_ = cancel; }

  // `compile_s`, when given, gets the compile time (0 when the spec was cached).
  StatusOr<std::shared_ptr<grammar::GrammarCache>> Get(const server::ConstraintSpec& spec, double* compile_s = nullptr);

 private:
  const Tokenizer* tokenizer_;
  std::vector<int64_t> eos_ids_;
  size_t capacity_;
  const std::atomic<bool>* cancel_ = nullptr;
  mutable std::mutex mu_;
  std::shared_ptr<const grammar::TokenVocab> vocab_;
  std::list<std::pair<std::string, std::shared_ptr<grammar::GrammarCache>>> lru_;
  std::unordered_map<std::string, decltype(lru_)::iterator> index_;
};

}  // namespace fathom
