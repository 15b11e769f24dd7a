#include "grammar/json_schema.h"

#include <gtest/gtest.h>

#include "grammar/regex.h"

namespace fathom::grammar {
namespace {

std::shared_ptr<const CompiledGrammar> FromSchema(const std::string& schema, JsonSchemaOptions options = {}) {
  auto g = JsonSchemaToGrammar(nlohmann::ordered_json::parse(schema), options);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  if (!g.ok()) return nullptr;
  auto c = Compile(*g, {});
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : nullptr;
}

std::string Refusal(const std::string& schema) {
  auto g = JsonSchemaToGrammar(nlohmann::ordered_json::parse(schema), {});
  return g.ok() ? "" : std::string(g.status().message());
}

#define EXPECT_MATCH(g, text) EXPECT_TRUE(Matches(*(g), text)) << (text)
#define EXPECT_NO_MATCH(g, text) EXPECT_FALSE(Matches(*(g), text)) << (text)

TEST(JsonSchemaTest, Strings) {
  auto g = FromSchema(R"({"type": "string"})");
  EXPECT_MATCH(g, R"("abc")");
  EXPECT_MATCH(g, R"("")");
  EXPECT_MATCH(g, R"("a\"b\\c\n\u00e9é😀")");
  EXPECT_NO_MATCH(g, R"(abc)");
  EXPECT_NO_MATCH(g, "\"a\nb\"");     // a raw control character
  EXPECT_NO_MATCH(g, R"("\ud800")");  // a lone surrogate escape
  EXPECT_NO_MATCH(g, R"("\x")");
  auto len = FromSchema(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_NO_MATCH(len, R"("a")");
  EXPECT_MATCH(len, R"("ab")");
  EXPECT_MATCH(len, R"("\n\t")");  // an escape is one character
  EXPECT_MATCH(len, R"("aé😀")");
  EXPECT_NO_MATCH(len, R"("abcd")");
}

TEST(JsonSchemaTest, PatternsSearchUnlessAnchored) {
  auto anchored = FromSchema(R"({"type": "string", "pattern": "^[a-z]+\\d$"})");
  EXPECT_MATCH(anchored, R"("abc1")");
  EXPECT_NO_MATCH(anchored, R"("abc")");
  EXPECT_NO_MATCH(anchored, R"("Xabc1")");
  auto search = FromSchema(R"({"type": "string", "pattern": "ab+"})");
  EXPECT_MATCH(search, R"("xxabbyy")");
  EXPECT_NO_MATCH(search, R"("xxayy")");
  // Characters JSON must escape are written escaped, once each.
  auto quote = FromSchema(R"({"type": "string", "pattern": "^a\"\\\\b\\n$"})");
  EXPECT_MATCH(quote, R"("a\"\\b\n")");
  EXPECT_NO_MATCH(quote, R"("a\u0022\\b\n")");
  // A pattern with length bounds: both hold.
  auto bounded = FromSchema(R"({"type": "string", "pattern": "^[a-z\"]+\\d?$", "minLength": 2, "maxLength": 4})");
  EXPECT_NO_MATCH(bounded, R"("a")");
  EXPECT_MATCH(bounded, R"("ab")");
  EXPECT_MATCH(bounded, R"("a\"b1")");  // the escape is one character
  EXPECT_MATCH(bounded, R"("abc1")");
  EXPECT_NO_MATCH(bounded, R"("abcd1")");
  EXPECT_NO_MATCH(bounded, R"("ab1c")");
  auto search_min = FromSchema(R"({"type": "string", "pattern": "x", "minLength": 3})");
  EXPECT_NO_MATCH(search_min, R"("xx")");
  EXPECT_MATCH(search_min, R"("axbcdefg")");
  EXPECT_NE(Refusal(R"({"type": "string", "pattern": "(a)\\1"})").find("backreferences"), std::string::npos);
  EXPECT_NE(Refusal(R"j({"type": "string", "pattern": "a(?=b)"})j").find("lookaround"), std::string::npos);
}

TEST(JsonSchemaTest, Formats) {
  auto date = FromSchema(R"({"type": "string", "format": "date"})");
  EXPECT_MATCH(date, R"("2024-02-28")");
  EXPECT_MATCH(date, R"("1999-12-31")");
  EXPECT_NO_MATCH(date, R"("2024-02-30")");
  EXPECT_NO_MATCH(date, R"("2024-13-01")");
  auto dt = FromSchema(R"({"type": "string", "format": "date-time"})");
  EXPECT_MATCH(dt, R"("2024-05-06T07:08:09Z")");
  EXPECT_MATCH(dt, R"("2024-05-06T07:08:09.123+02:00")");
  EXPECT_NO_MATCH(dt, R"("2024-05-06 07:08:09Z")");
  auto uuid = FromSchema(R"({"format": "uuid"})");
  EXPECT_MATCH(uuid, R"("123e4567-e89b-12d3-a456-426614174000")");
  EXPECT_NO_MATCH(uuid, R"("123e4567")");
  auto ip = FromSchema(R"({"type": "string", "format": "ipv4"})");
  EXPECT_MATCH(ip, R"("192.168.0.255")");
  EXPECT_NO_MATCH(ip, R"("192.168.0.256")");
  EXPECT_NO_MATCH(ip, R"("01.2.3.4")");
  auto email = FromSchema(R"({"type": "string", "format": "email"})");
  EXPECT_MATCH(email, R"("a.b+c@example.co")");
  EXPECT_NO_MATCH(email, R"("a@b")");
  auto short_email = FromSchema(R"({"type": "string", "format": "email", "maxLength": 8})");
  EXPECT_MATCH(short_email, R"("a@bc.de")");
  EXPECT_NO_MATCH(short_email, R"("ab@cd.efg")");
  auto unknown = FromSchema(R"({"type": "string", "format": "made-up"})");  // an annotation
  EXPECT_MATCH(unknown, R"("anything")");
}

TEST(JsonSchemaTest, IntegerAndNumberBounds) {
  auto g = FromSchema(R"({"type": "integer", "minimum": 5, "maximum": 120})");
  for (const char* ok : {"5", "9", "10", "99", "100", "119", "120"}) EXPECT_MATCH(g, ok);
  for (const char* bad : {"4", "121", "05", "-1", "1000", "5.0"}) EXPECT_NO_MATCH(g, bad);
  auto neg = FromSchema(R"({"type": "integer", "minimum": -15, "exclusiveMaximum": -2})");
  for (const char* ok : {"-15", "-10", "-3"}) EXPECT_MATCH(neg, ok);
  for (const char* bad : {"-2", "-16", "0", "-0"}) EXPECT_NO_MATCH(neg, bad);
  auto draft4 = FromSchema(R"({"type": "integer", "minimum": 0, "exclusiveMinimum": true})");
  EXPECT_NO_MATCH(draft4, "0");
  EXPECT_MATCH(draft4, "1");
  EXPECT_MATCH(draft4, "123456789012");
  auto span = FromSchema(R"({"type": "integer", "minimum": -3, "maximum": 3})");
  for (const char* ok : {"-3", "-1", "0", "3"}) EXPECT_MATCH(span, ok);
  EXPECT_NO_MATCH(span, "-0");
  auto number = FromSchema(R"({"type": "number", "minimum": 0, "maximum": 10})");
  for (const char* ok : {"0", "3.5", "9.999", "10"}) EXPECT_MATCH(number, ok);
  for (const char* bad : {"10.5", "-1", "11", "1e3"}) EXPECT_NO_MATCH(number, bad);
  auto any = FromSchema(R"({"type": "number"})");
  for (const char* ok : {"0", "-0.5", "12e3", "1.5E-7"}) EXPECT_MATCH(any, ok);
  for (const char* bad : {"01", ".5", "1.", "+1", "1e999"}) EXPECT_NO_MATCH(any, bad);
}

// zod 4 writes every z.int() / z.number().int() as minimum -(2^53 - 1), maximum 2^53 - 1; any int64 bounds compile
// to a small automaton (a range is a few digit-prefix states a length, not an enumeration: before, each side of a
// digit range recursed into both, and these bounds built 400,000 states and were refused).
TEST(JsonSchemaTest, IntegerBoundsUpTo64BitsCompileSmall) {
  auto zod = FromSchema(R"({"type": "integer", "minimum": -9007199254740991, "maximum": 9007199254740991})");
  ASSERT_NE(zod, nullptr);
  for (const char* ok : {"0", "7", "-1", "42", "-9007199254740991", "9007199254740991", "9007199254740990",
                         "1000000000000000", "8999999999999999", "-123456789012345"}) {
    EXPECT_MATCH(zod, ok);
  }
  for (const char* bad :
       {"9007199254740992", "-9007199254740992", "9100000000000000", "10000000000000000", "-0", "01", "1.5"}) {
    EXPECT_NO_MATCH(zod, bad);
  }
  EXPECT_LT(zod->states().size(), 400u) << "states of the zod integer";
  auto full = FromSchema(R"({"type": "integer", "minimum": -9223372036854775808, "maximum": 9223372036854775807})");
  ASSERT_NE(full, nullptr);
  for (const char* ok : {"9223372036854775807", "-9223372036854775808", "9223372036854775799", "0"}) {
    EXPECT_MATCH(full, ok);
  }
  for (const char* bad : {"9223372036854775808", "-9223372036854775809", "10000000000000000000"}) {
    EXPECT_NO_MATCH(full, bad);
  }
  EXPECT_LT(full->states().size(), 400u);
  // Digit ranges whose ends share a prefix, or are one apart, or cross a power of ten.
  auto mid = FromSchema(R"({"type": "integer", "minimum": 15, "maximum": 1237})");
  for (const char* ok : {"15", "19", "20", "99", "100", "999", "1000", "1199", "1230", "1237"}) EXPECT_MATCH(mid, ok);
  for (const char* bad : {"14", "9", "1238", "1240", "1300", "2000", "10000"}) EXPECT_NO_MATCH(mid, bad);
  auto tight = FromSchema(R"({"type": "integer", "minimum": 19, "maximum": 20})");
  EXPECT_MATCH(tight, "19");
  EXPECT_MATCH(tight, "20");
  for (const char* bad : {"18", "21", "10", "29"}) EXPECT_NO_MATCH(tight, bad);
  // Past 64 bits is refused by name.
  EXPECT_NE(Refusal(R"({"type": "integer", "maximum": 1e19})").find("out of the supported range"), std::string::npos);
}

TEST(JsonSchemaTest, EnumConstBooleanNull) {
  auto e = FromSchema(R"({"enum": ["a", 1, null, "é", {"k": [true]}]})");
  for (const char* ok : {R"("a")", "1", "null", R"("é")", R"({"k":[true]})"}) EXPECT_MATCH(e, ok);
  EXPECT_NO_MATCH(e, R"("b")");
  auto typed = FromSchema(R"({"type": "string", "enum": ["x", 2]})");  // 2 is not a string: never written
  EXPECT_MATCH(typed, R"("x")");
  EXPECT_NO_MATCH(typed, "2");
  auto c = FromSchema(R"({"const": "fixed"})");
  EXPECT_MATCH(c, R"("fixed")");
  auto b = FromSchema(R"({"type": ["boolean", "null"]})");
  EXPECT_MATCH(b, "true");
  EXPECT_MATCH(b, "null");
  EXPECT_NO_MATCH(b, "0");
}

TEST(JsonSchemaTest, ObjectsKeepOrderAndRequiredProperties) {
  auto g = FromSchema(
      R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "null"}},
          "required": ["a", "c"]})");
  EXPECT_MATCH(g, R"({"a":1,"c":null})");
  EXPECT_MATCH(g, R"({"a":1,"b":"x","c":null})");
  EXPECT_NO_MATCH(g, R"({"c":null,"a":1})");
  EXPECT_NO_MATCH(g, R"({"a":1})");
  EXPECT_NO_MATCH(g, R"({"a":1,"c":null,"d":1})");  // additionalProperties absent beside properties: none written
  auto optional = FromSchema(R"({"properties": {"x": {"const": 1}, "y": {"const": 2}}})");
  for (const char* ok : {"{}", R"({"x":1})", R"({"y":2})", R"({"x":1,"y":2})"}) EXPECT_MATCH(optional, ok);
  EXPECT_NO_MATCH(optional, R"({,"y":2})");
  EXPECT_NO_MATCH(optional, R"({"x":1,})");
  auto spaced =
      FromSchema(R"({"properties": {"x": {"const": 1}}, "required": ["x"]})", JsonSchemaOptions{.max_whitespace = 2});
  EXPECT_MATCH(spaced, "{ \"x\" :\n1 }");
  EXPECT_NO_MATCH(spaced, "{    \"x\":1}");
}

TEST(JsonSchemaTest, AdditionalPropertiesNeverRepeatAKey) {
  auto g = FromSchema(R"({"properties": {"a": {"type": "string"}, "ab": {"type": "string"}},
                          "additionalProperties": {"type": "integer"}})");
  EXPECT_MATCH(g, R"({"a":"x","zz":3})");
  EXPECT_MATCH(g, R"({"abc":3,"b":4})");
  EXPECT_MATCH(g, R"({"":3})");
  EXPECT_NO_MATCH(g, R"({"a":"x","a":3})");
  EXPECT_NO_MATCH(g, R"({"ab":3})");
  auto any = FromSchema(R"({"type": "object"})");
  EXPECT_MATCH(any, R"({"k":[1,{"n":null}],"s":"t"})");
}

TEST(JsonSchemaTest, ObjectCountsAndPatternPropertiesThatCannotMatch) {
  auto min = FromSchema(R"({"properties": {"a": {"const": 1}, "b": {"const": 2}, "c": {"const": 3}},
                            "minProperties": 2})");
  EXPECT_MATCH(min, R"({"a":1,"b":2})");
  EXPECT_NO_MATCH(min, R"({"a":1})");
  auto pattern = FromSchema(R"({"properties": {"name": {"type": "string"}}, "patternProperties": {"^x-": {}},
                                "additionalProperties": false})");
  EXPECT_MATCH(pattern, R"({"name":"n"})");
  // A required property that `properties` does not list takes any value unless additionalProperties is false.
  auto extra_required = FromSchema(R"({"properties": {"a": {"const": 1}}, "required": ["z"]})");
  EXPECT_MATCH(extra_required, R"({"z":[true]})");
  EXPECT_NE(Refusal(R"({"properties": {}, "required": ["z"], "additionalProperties": false})").find("names 'z'"),
            std::string::npos);
}

TEST(JsonSchemaTest, Arrays) {
  auto g = FromSchema(R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3})");
  EXPECT_NO_MATCH(g, "[]");
  EXPECT_MATCH(g, "[1]");
  EXPECT_MATCH(g, "[1,2,3]");
  EXPECT_NO_MATCH(g, "[1,2,3,4]");
  EXPECT_NO_MATCH(g, "[1,]");
  auto tuple = FromSchema(R"({"prefixItems": [{"type": "string"}, {"type": "integer"}], "items": false})");
  EXPECT_MATCH(tuple, "[]");
  EXPECT_MATCH(tuple, R"(["a"])");
  EXPECT_MATCH(tuple, R"(["a",1])");
  EXPECT_NO_MATCH(tuple, R"(["a",1,2])");
  EXPECT_NO_MATCH(tuple, R"([1])");
  auto draft4 = FromSchema(R"({"items": [{"const": 0}], "additionalItems": {"type": "boolean"}, "minItems": 2})");
  EXPECT_MATCH(draft4, "[0,true,false]");
  EXPECT_NO_MATCH(draft4, "[0]");
  auto unique = FromSchema(R"({"type": "array", "items": {"type": "integer"}, "uniqueItems": true})");
  EXPECT_MATCH(unique, "[]");
  EXPECT_MATCH(unique, "[7]");
  EXPECT_NO_MATCH(unique, "[7,8]");  // at most one item: always unique
  auto many = FromSchema(R"({"type": "array", "items": {"type": "string"}, "minItems": 10})");
  EXPECT_NO_MATCH(many, R"(["","","","","","","","",""])");
  EXPECT_MATCH(many, R"(["","","","","","","","","",""])");
}

TEST(JsonSchemaTest, RefsDefsAndRecursion) {
  auto tree = FromSchema(R"({"type": "object", "properties": {"v": {"type": "integer"},
                             "kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["v"]})");
  EXPECT_MATCH(tree, R"({"v":1})");
  EXPECT_MATCH(tree, R"({"v":1,"kids":[{"v":2,"kids":[]},{"v":3,"kids":[{"v":4}]}]})");
  EXPECT_NO_MATCH(tree, R"({"v":1,"kids":[{}]})");
  auto defs = FromSchema(R"({"$defs": {"p": {"type": "object", "properties": {"n": {"$ref": "#/$defs/n"}},
                                              "required": ["n"]}, "n": {"type": "integer", "minimum": 0}},
                             "type": "array", "items": {"$ref": "#/$defs/p"}})");
  EXPECT_MATCH(defs, R"([{"n":0},{"n":7}])");
  EXPECT_NO_MATCH(defs, R"([{"n":-1}])");
  auto old = FromSchema(R"({"definitions": {"a": {"const": "A"}}, "$ref": "#/definitions/a"})");
  EXPECT_MATCH(old, R"("A")");
  EXPECT_NE(Refusal(R"({"$ref": "#/$defs/missing"})").find("resolves to nothing"), std::string::npos);
  EXPECT_NE(Refusal(R"({"$ref": "https://example.com/s.json"})").find("outside the document"), std::string::npos);
}

TEST(JsonSchemaTest, AnyOfOneOfAllOf) {
  auto any = FromSchema(R"({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}]})");
  EXPECT_MATCH(any, "12");
  EXPECT_MATCH(any, R"("a")");
  EXPECT_NO_MATCH(any, R"("ab")");
  auto one = FromSchema(R"({"oneOf": [{"const": 1}, {"const": 2}]})");
  EXPECT_MATCH(one, "2");
  auto all = FromSchema(R"({"allOf": [{"properties": {"a": {"const": 1}}, "required": ["a"]},
                                      {"properties": {"b": {"const": 2}}, "required": ["b"]}]})");
  EXPECT_MATCH(all, R"({"a":1,"b":2})");
  EXPECT_NO_MATCH(all, R"({"a":1})");
  // Siblings of anyOf apply to every branch.
  auto siblings = FromSchema(R"({"type": "object", "properties": {"k": {"type": "string"}},
                                 "anyOf": [{"required": ["k"]}]})");
  EXPECT_MATCH(siblings, R"({"k":"v"})");
  EXPECT_NO_MATCH(siblings, "{}");
  EXPECT_NE(Refusal(R"({"allOf": [{"type": "string"}, {"type": "integer"}]})").find("does not merge simply"),
            std::string::npos);
  // Malformed parts are refused, not merged (an allOf of a `properties` array threw out of the JSON library: found by
  // the grammar fuzzer, tests/data/fuzz/grammar/schema_allof_malformed).
  EXPECT_NE(Refusal(R"({"allOf": [{"type": "object", "properties": ["b"]}], "minProperties": 1})")
                .find("has 'properties' that is not an object"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"required": "a", "allOf": [{"required": ["b"]}]})").find("has 'required' that is not an array"),
            std::string::npos);
  // A $ref with a '%' that is no %-escape is a pointer to nothing, not a throw out of std::stoi (the grammar fuzzer's
  // tests/data/fuzz/grammar/schema_ref_bad_escape).
  EXPECT_NE(Refusal(R"({"$defs": {"n": {"type": "integer"}}, "$ref": "#/%$defs/n"})"), "");
  auto escaped = FromSchema(R"({"$defs": {"a b": {"type": "integer"}}, "$ref": "#/$defs/a%20b"})");
  EXPECT_MATCH(escaped, "7");
}

// What zod 4 writes for z.record(...): propertyNames {"type": "string"} always holds; an enum or pattern there
// constrains the keys of a record (an object of extra properties alone).
TEST(JsonSchemaTest, PropertyNamesOfRecords) {
  auto any = FromSchema(R"({"type": "object", "propertyNames": {"type": "string"},
                            "additionalProperties": {"type": "integer"}})");
  EXPECT_MATCH(any, R"({"a":1,"b c":2})");
  EXPECT_MATCH(any, "{}");
  EXPECT_NO_MATCH(any, R"({"a":"x"})");
  auto with_props = FromSchema(R"({"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"],
                                   "propertyNames": {"type": "string"}, "additionalProperties": false})");
  EXPECT_MATCH(with_props, R"({"k":1})");
  auto keys = FromSchema(R"({"type": "object", "propertyNames": {"enum": ["x", "y"]},
                             "additionalProperties": {"type": "boolean"}})");
  EXPECT_MATCH(keys, R"({"x":true,"y":false})");
  EXPECT_NO_MATCH(keys, R"({"z":true})");
  auto pattern = FromSchema(R"({"type": "object", "propertyNames": {"pattern": "^[a-z]+$"},
                                "additionalProperties": {"type": "null"}})");
  EXPECT_MATCH(pattern, R"({"abc":null})");
  EXPECT_NO_MATCH(pattern, R"({"aB":null})");
  auto none = FromSchema(R"({"type": "object", "propertyNames": false})");
  EXPECT_MATCH(none, "{}");
  EXPECT_NO_MATCH(none, R"({"a":1})");
  EXPECT_NE(Refusal(R"({"type": "object", "propertyNames": {"type": "integer"}})").find("must describe strings"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"type": "object", "properties": {"a": {}}, "propertyNames": {"pattern": "^a"}})")
                .find("beside declared"),
            std::string::npos);
}

// zod writes a format and its own pattern together (z.email(), z.uuid(), z.iso.date(), z.iso.datetime()): the
// pattern is written (format is an annotation since draft 2019-09).
TEST(JsonSchemaTest, FormatWithPatternWritesThePattern) {
  auto uuid = FromSchema(R"({"type": "string", "format": "uuid",
      "pattern": "^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-8][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12})$"})");
  EXPECT_MATCH(uuid, R"("123e4567-E89b-12d3-a456-426614174000")");
  EXPECT_NO_MATCH(uuid, R"("123e4567-e89b-02d3-a456-426614174000")");  // version 0: the pattern's, not the format's
  auto date = FromSchema(R"({"type": "string", "format": "date", "pattern": "^\\d{4}-\\d{2}-\\d{2}$"})");
  EXPECT_MATCH(date, R"("2026-12-06")");
  EXPECT_NO_MATCH(date, R"("2026-1-6")");
}

TEST(JsonSchemaTest, UnsupportedKeywordsAreRefusedByName) {
  for (const char* kw : {"not", "if", "dependentRequired", "dependencies", "contains", "multipleOf"}) {
    const std::string schema = std::string(R"({"type": "object", ")") + kw + R"(": {}})";
    EXPECT_NE(Refusal(schema).find(std::string("'") + kw + "' at '#' is not supported"), std::string::npos)
        << kw << ": " << Refusal(schema);
  }
  EXPECT_NE(Refusal(R"({"type": "array", "uniqueItems": true, "minItems": 2})").find("'uniqueItems'"),
            std::string::npos);
  EXPECT_EQ(Refusal(R"({"type": "array", "uniqueItems": false})"), "");
  EXPECT_NE(Refusal(R"({"properties": {"ab": {}}, "patternProperties": {"^a": {}}})").find("matching property 'ab'"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"patternProperties": {"^a": {}}, "additionalProperties": true})").find("beside"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"properties": {"a": {"not": {}}}})").find("at '/properties/a'"), std::string::npos);
  EXPECT_NE(Refusal("false").find("no value satisfies"), std::string::npos);
  EXPECT_NE(Refusal(R"({"type": "strin"})").find("'strin' is not a JSON Schema type"), std::string::npos);
  // Annotations and unknown keywords are not validation: ignored.
  EXPECT_EQ(Refusal(R"({"type": "string", "title": "t", "description": "d", "default": "x", "x-vendor": 1})"), "");
}

TEST(JsonSchemaTest, AnyJson) {
  auto c = Compile(AnyJsonGrammar({}, /*object_only=*/true), {});
  ASSERT_TRUE(c.ok());
  EXPECT_MATCH(*c, R"({"a":[1,2.5,"x",{"b":null}],"c":true})");
  EXPECT_NO_MATCH(*c, "[1]");
  EXPECT_NO_MATCH(*c, R"({"a":1,})");
}

TEST(RegexTest, ClassesQuantifiersAndEscapes) {
  auto compile = [](const std::string& re) {
    auto e = RegexToExpr(re, RawUtf8, RegexOptions{});
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    GrammarBuilder b;
    const int32_t r = b.Add("re", *e);
    return *Compile(b.Finish(r), {});
  };
  auto g = compile("[A-Fa-f0-9]{2,3}(-[^-\\s]+)*\\.?");
  EXPECT_MATCH(g, "aF");
  EXPECT_MATCH(g, "abc-x-é.");
  EXPECT_NO_MATCH(g, "a");
  EXPECT_NO_MATCH(g, "abcd");
  EXPECT_NO_MATCH(g, "ab- x");
  auto alt = compile("(?:cat|dog)s?|\\u00e9\\x41");
  EXPECT_MATCH(alt, "cats");
  EXPECT_MATCH(alt, "dog");
  EXPECT_MATCH(alt, "éA");
  auto dot = compile("a.c");
  EXPECT_MATCH(dot, "a€c");
  EXPECT_NO_MATCH(dot, "a\nc");
  auto literal_brace = compile("a{,2}");  // not a quantifier: literal text
  EXPECT_MATCH(literal_brace, "a{,2}");
  // Anchors that open and close top-level alternatives, also inside a group that is a whole alternative.
  auto anchored = RegexToExpr("^$|(^a+$)|^b", RawUtf8, RegexOptions{.search = true});
  ASSERT_TRUE(anchored.ok()) << anchored.status().ToString();
  {
    GrammarBuilder b;
    const int32_t r = b.Add("re", *anchored);
    auto c = *Compile(b.Finish(r), {});
    EXPECT_MATCH(c, "");
    EXPECT_MATCH(c, "aaa");
    EXPECT_NO_MATCH(c, "xa");
    EXPECT_MATCH(c, "bxyz");
    EXPECT_NO_MATCH(c, "xb");
  }
  for (const char* bad : {"(a", "a)", "[a", "*a", "a{3,1}", "\\bword", "a$b", "a^b", "(a$)b"}) {
    EXPECT_FALSE(RegexToExpr(bad, RawUtf8, RegexOptions{}).ok()) << bad;
  }
}

}  // namespace
}  // namespace fathom::grammar
