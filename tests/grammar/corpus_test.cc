// The schema corpus (tests/data/jsonschema, 103 real-world schemas) at the DeepSeek-V3 vocabulary: every schema is
// either refused with an error naming what is unsupported, or compiled; random walks under its masks give outputs
// that python3-jsonschema validates (tests/grammar/validate_outputs.py, with format checking).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/schema_walk.h"  // tests/grammar
#include "grammar/vocab_text.h"
#include "tokenizer/tokenizer.h"

namespace fathom::grammar {
namespace {

TEST(SchemaCorpusTest, OutputsUnderEveryAcceptedSchemaValidate) {
  auto tok = Tokenizer::FromDirectory(std::string(FATHOM_TOKENIZER_TEST_DATA) + "/deepseek-v3");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  auto vocab = VocabFromTokenizer(**tok);
  ASSERT_EQ(vocab->size(), 128815u);  // the tokenizer's ids; the model's 129,280 logits pad it

  std::ifstream in(std::string(FATHOM_TEST_DATA_DIR) + "/jsonschema/schemas.jsonl");
  ASSERT_TRUE(in) << "tests/data/jsonschema/schemas.jsonl";
  const std::string out_path = std::string(FATHOM_BINARY_DIR) + "/tests/grammar/corpus_outputs.jsonl";
  std::ofstream out(out_path);
  int schemas = 0, accepted = 0, walks = 0, finished = 0;
  std::string line;
  while (std::getline(in, line)) {
    const auto row = nlohmann::ordered_json::parse(line);
    ++schemas;
    const std::string id = row["dataset"].get<std::string>() + "/" + row["id"].get<std::string>();
    auto grammar = JsonSchemaToGrammar(row["schema"], JsonSchemaOptions{});
    StatusOr<std::shared_ptr<const CompiledGrammar>> compiled =
        grammar.ok() ? Compile(*grammar, CompileOptions{})
                     : StatusOr<std::shared_ptr<const CompiledGrammar>>(grammar.status());
    if (!compiled.ok()) {
      // A refusal names what it refuses.
      const std::string msg(compiled.status().message());
      EXPECT_TRUE(msg.find("not supported") != std::string::npos ||
                  msg.find("grammar too large") != std::string::npos ||
                  msg.find("does not merge simply") != std::string::npos)
          << id << ": " << msg;
      std::printf("refused %s: %s\n", id.c_str(), msg.c_str());
      continue;
    }
    ++accepted;
    auto cache = std::make_shared<GrammarCache>(*compiled, vocab);
    for (uint64_t seed = 0; seed < 3; ++seed) {
      GrammarMatcher m(cache);
      WalkResult r = RandomWalk(m, seed, WalkOptions{.max_tokens = 600, .close_after = 48});
      ++walks;
      if (!r.finished) {
        std::printf("unfinished %s seed %d after %d tokens\n", id.c_str(), static_cast<int>(seed), r.tokens);
        continue;
      }
      ++finished;
      out << nlohmann::ordered_json{{"id", id}, {"schema", row["schema"]}, {"output", r.text}}.dump(
                 -1, ' ', false, nlohmann::ordered_json::error_handler_t::replace)
          << "\n";
    }
  }
  out.close();
  std::printf("%d schemas, %d accepted, %d walks, %d finished\n", schemas, accepted, walks, finished);
  EXPECT_EQ(schemas, 103);
  EXPECT_GE(accepted, 90);
  EXPECT_GE(finished, walks * 9 / 10);
  const std::string cmd =
      "/usr/bin/python3 " + std::string(FATHOM_SOURCE_DIR) + "/tests/grammar/validate_outputs.py " + out_path;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

}  // namespace
}  // namespace fathom::grammar
