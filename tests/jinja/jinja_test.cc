// Tests of the Jinja subset interpreter (src/jinja) that renders chat templates.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "jinja/template.h"

namespace fathom::jinja {
namespace {

// Renders `source` with the JSON object `context`; returns the output or "ERROR: <message>".
std::string Render(const std::string& source, const std::string& context = "{}", TemplateOptions options = {}) {
  auto tmpl = Template::Parse(source, "test", options);
  if (!tmpl.ok()) return "ERROR: " + tmpl.status().message();
  auto out = (*tmpl)->Render(Value::FromJson(nlohmann::ordered_json::parse(context)));
  if (!out.ok()) return "ERROR: " + out.status().message();
  return *out;
}

TEST(JinjaTest, OutputsAndLiterals) {
  EXPECT_EQ(Render("Hello {{ name }}!", R"({"name": "world"})"), "Hello world!");
  EXPECT_EQ(Render("{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ 7 % 3 }} {{ 2 ** 3 }} {{ -4 }} {{ 1.5 }} {{ 7 / 2 }}"),
            "7 3 1 8 -4 1.5 3.5");
  EXPECT_EQ(Render("{{ none }} {{ None }} {{ true }} {{ False }} [{{ missing }}]"), "None None True False []");
  EXPECT_EQ(Render("{{ [1, 'a', none] }} {{ {'k': 'v'} }}"), "[1, 'a', None] {'k': 'v'}");
  EXPECT_EQ(Render(R"({{ 'it\'s' ~ "\n" ~ 'x' }})"), "it's\nx");
}

TEST(JinjaTest, ConcatenationAndMembership) {
  EXPECT_EQ(Render("{{ 'a' + 'b' ~ 1 ~ none }}"), "ab1None");
  EXPECT_EQ(Render("{{ 'ell' in 'hello' }} {{ 'x' not in 'hello' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }}"),
            "True True True True");
  EXPECT_EQ(Render("{{ 'a' + 1 }}"), "ERROR: template 'test', line 1: can only concatenate str (not \"int\") to str");
  EXPECT_EQ(Render("{{ 'a' in none }}"), "ERROR: template 'test', line 1: argument of type 'NoneType' is not iterable");
}

TEST(JinjaTest, TestsBindTighterThanNot) {
  EXPECT_EQ(
      Render("{{ not x is defined }} {{ x is not defined }} {{ y is none }} {{ y is not none }}", R"({"y": null})"),
      "True True True False");
  EXPECT_EQ(Render("{{ s is string }} {{ n is string }} {{ n is number }} {{ b is false }} {{ d is mapping }}",
                   R"({"s": "x", "n": 1, "b": false, "d": {}})"),
            "True False True True True");
}

TEST(JinjaTest, IfElifElse) {
  const std::string t = "{% if n == 1 %}one{% elif n == 2 %}two{% else %}many{% endif %}";
  EXPECT_EQ(Render(t, R"({"n": 1})"), "one");
  EXPECT_EQ(Render(t, R"({"n": 2})"), "two");
  EXPECT_EQ(Render(t, R"({"n": 5})"), "many");
  EXPECT_EQ(Render("{{ 'y' if flag else 'n' }}", R"({"flag": true})"), "y");
}

TEST(JinjaTest, ForLoopVariablesAndSlicing) {
  EXPECT_EQ(
      Render("{% for x in xs %}{{ loop.index0 }}{{ x }}{% if loop.first %}F{% endif %}{% if loop.last %}L{% endif %},"
             "{% endfor %}",
             R"({"xs": ["a", "b", "c"]})"),
      "0aF,1b,2cL,");
  EXPECT_EQ(Render("{% for x in xs[::-1] %}{{ x }}{% endfor %}|{{ xs[1:] }}|{{ xs[-1] }}|{{ 'abc'[::-1] }}",
                   R"({"xs": [1, 2, 3]})"),
            "321|[2, 3]|3|cba");
  EXPECT_EQ(Render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(Render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", R"({"d": {"b": 1, "a": 2}})"),
            "b=1;a=2;");
  EXPECT_EQ(Render("{% for x in range(5) if x is even %}{{ x }}{% endfor %}"), "024");
  EXPECT_EQ(
      Render("{% for x in range(9) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}"
             "{{ x }}{% endfor %}"),
      "013");
}

TEST(JinjaTest, SetScopingAndNamespace) {
  // A plain set inside a loop does not leak out; a namespace attribute does.
  EXPECT_EQ(Render("{% set x = 1 %}{% set ns = namespace(y=1) %}{% for i in [1, 2] %}{% set x = x + i %}"
                   "{% set ns.y = ns.y + i %}{% endfor %}{{ x }} {{ ns.y }}"),
            "1 4");
  EXPECT_EQ(Render("{% set s %}block {{ 1 }}{% endset %}[{{ s }}]"), "[block 1]");
  EXPECT_EQ(Render("{% set x = 1 %}{% set x.y = 2 %}"),
            "ERROR: template 'test', line 1: cannot assign attribute on non-namespace object 'x'");
}

TEST(JinjaTest, WhitespaceControl) {
  EXPECT_EQ(Render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  EXPECT_EQ(Render("a {{- 'b' -}} c"), "abc");
  // trim_blocks drops the newline after a block tag; lstrip_blocks the indentation before it.
  EXPECT_EQ(Render("x\n  {% if true %}\n  y\n  {% endif %}\nz"), "x\n  y\nz");
  TemplateOptions raw{.trim_blocks = false, .lstrip_blocks = false};
  EXPECT_EQ(Render("x\n  {% if true %}\n  y\n  {% endif %}\nz", "{}", raw), "x\n  \n  y\n  \nz");
  EXPECT_EQ(Render("a{# comment #}b"), "ab");
  EXPECT_EQ(Render("{% raw %}{{ not evaluated }}{% endraw %}"), "{{ not evaluated }}");
}

TEST(JinjaTest, Filters) {
  EXPECT_EQ(
      Render("[{{ '  x  ' | trim }}] [{{ none | trim }}] {{ xs | length }} {{ 'AbC' | lower }} {{ 'abc' | upper }}",
             R"({"xs": [1, 2]})"),
      "[x] [None] 2 abc ABC");
  EXPECT_EQ(Render("{{ v | tojson }}", R"({"v": {"a": [1, 2.5, null, true], "s": "é\"\n"}})"),
            R"({"a": [1, 2.5, null, true], "s": "é\"\n"})");
  EXPECT_EQ(Render("{{ v | tojson(indent=2) }}", R"({"v": {"a": [1]}})"), "{\n  \"a\": [\n    1\n  ]\n}");
  EXPECT_EQ(Render("{{ missing | default('d') }} {{ xs | join(', ') }} {{ xs | first }} {{ xs | last }}",
                   R"({"xs": ["a", "b"]})"),
            "d a, b a b");
  EXPECT_EQ(Render("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }}",
                   R"({"ms": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})"),
            "['q']");
  EXPECT_EQ(Render("{{ x | nosuchfilter }}"), "ERROR: template 'test', line 1: unknown filter 'nosuchfilter'");
}

TEST(JinjaTest, StringMethods) {
  EXPECT_EQ(Render("{{ s.startswith('<a>') }} {{ s.endswith('</a>') }} {{ s.split('>')[1] }} {{ s.split('>')[-1] }}",
                   R"({"s": "<a>x</a>"})"),
            "True True x</a ");
  EXPECT_EQ(Render("[{{ '\n\nx\n'.strip('\n') }}] [{{ '  x '.lstrip() }}] [{{ 'x\n\n'.rstrip('\n') }}] "
                   "[{{ 'a b  c'.split() }}]"),
            "[x] [x ] [x] [['a', 'b', 'c']]");
  EXPECT_EQ(Render("{{ 'a-b'.replace('-', '+') }} {{ 'hi'.upper() }} {{ 'x'.nosuch() }}"),
            "ERROR: template 'test', line 1: 'str' object has no attribute 'nosuch'");
}

TEST(JinjaTest, AttributeAndItemAccess) {
  EXPECT_EQ(Render("{{ m.role }} {{ m['role'] }} [{{ m.missing }}] {{ m.missing is defined }} {{ ms[0].role }}",
                   R"({"m": {"role": "user"}, "ms": [{"role": "x"}]})"),
            "user user [] False x");
  EXPECT_EQ(Render("{{ m.get('a', 'dflt') }} {{ m.keys() | list }}", R"({"m": {"b": 1}})"), "dflt ['b']");
  EXPECT_EQ(Render("{{ nope.attr }}"), "ERROR: template 'test', line 1: 'nope' is undefined");
}

TEST(JinjaTest, MacroAndRaiseException) {
  EXPECT_EQ(Render("{% macro greet(who, punct='!') %}Hi {{ who }}{{ punct }}{% endmacro %}{{ greet('A') }} "
                   "{{ greet('B', punct='?') }}"),
            "Hi A! Hi B?");
  EXPECT_EQ(Render("line1\n{{ raise_exception('Roles must alternate') }}"),
            "ERROR: template 'test', line 2: Roles must alternate");
}

TEST(JinjaTest, SyntaxErrorsNameTheLine) {
  EXPECT_EQ(Render("ok\n{% if x %}\nno end"),
            "ERROR: template 'test', line 2: syntax error: unexpected end of template, expected 'elif'");
  EXPECT_EQ(Render("{{ 1 + }}"),
            "ERROR: template 'test', line 1: syntax error: unexpected end of tag, expected an expression");
  EXPECT_EQ(Render("a\nb\n{% frobnicate %}"),
            "ERROR: template 'test', line 3: syntax error: unknown or unsupported tag 'frobnicate'");
  EXPECT_EQ(Render("{{ 'unterminated }}"), "ERROR: template 'test', line 1: syntax error: unterminated string literal");
}

// A template is a program from a file: whatever it does, a render ends, with an error that names the bound it broke,
// and never with a crash, a hang or memory without end. Before these bounds each case below aborted (stack
// overflow, std::out_of_range, a signed overflow under UBSan, SIGFPE) or ran without end.
TEST(JinjaTest, HostileTemplatesEndInErrors) {
  auto error_of = [](const std::string& source, TemplateOptions options = {}) {
    const std::string out = Render(source, "{}", options);
    EXPECT_EQ(out.rfind("ERROR: ", 0), 0u) << source.substr(0, 80) << " rendered " << out.substr(0, 80);
    return out;
  };
  // Syntax nested past the parser's depth: 1000 parentheses, 10k nested ifs, a 10k-term chain.
  EXPECT_NE(
      error_of("{{ " + std::string(1000, '(') + "1" + std::string(1000, ')') + " }}").find("nested more than 100 deep"),
      std::string::npos);
  std::string ifs;
  for (int i = 0; i < 10000; ++i) ifs += "{% if true %}";
  EXPECT_NE(error_of(ifs).find("nested more than 100 deep"), std::string::npos);
  std::string chain = "{{ 1";
  for (int i = 0; i < 10000; ++i) chain += " + 1";
  EXPECT_NE(error_of(chain + " }}").find("more than 4096 tokens"), std::string::npos);
  std::string nots = "{{ ";
  for (int i = 0; i < 1000; ++i) nots += "not ";
  EXPECT_NE(error_of(nots + "1 }}").find("nested more than"), std::string::npos);
  // "{% endraw" with no "%}" after it: the lexer restarted at the top and filled memory (found by fuzz_chat_template).
  EXPECT_NE(error_of("a{% raw %}b{%endraw{{ x }}").find("unterminated endraw tag"), std::string::npos);
  EXPECT_EQ(Render("a{% raw %}{{ b }}{%- endraw %}c"), "a{{ b }}c");
  // split('') looped forever, filling memory (fuzz_chat_template); Python raises "empty separator".
  EXPECT_NE(error_of("{{ 'a,b'.split('') }}").find("split(): empty separator"), std::string::npos);
  EXPECT_EQ(Render("{{ 'a,b'.split(',') }} {{ ' a  b '.split() }} {{ 'a,b,c'.split(',', 1) }}"),
            "['a', 'b'] ['a', 'b'] ['a', 'b,c']");
  // Numbers: literals past int64, arithmetic past int64 (each was UB or an uncaught exception).
  EXPECT_NE(error_of("{{ 99999999999999999999 }}").find("out of range"), std::string::npos);
  EXPECT_NE(error_of("{{ 9223372036854775807 + 1 }}").find("integer overflow in +"), std::string::npos);
  EXPECT_NE(error_of("{{ -9223372036854775807 - 2 }}").find("integer overflow in -"), std::string::npos);
  EXPECT_NE(error_of("{{ 4294967296 * 4294967296 }}").find("integer overflow in *"), std::string::npos);
  EXPECT_NE(error_of("{{ 3 ** 100 }}").find("integer overflow in **"), std::string::npos);
  EXPECT_EQ(Render("{{ 1 ** 9223372036854775807 }} {{ (-1) ** 9223372036854775807 }}"), "1 -1");  // was 2^63 rounds
  EXPECT_NE(error_of("{{ (-9223372036854775807 - 1) // -1 }}").find("integer overflow"), std::string::npos);
  EXPECT_EQ(Render("{{ (-9223372036854775807 - 1) % -1 }}"), "0");  // was SIGFPE
  EXPECT_NE(error_of("{{ (10.0 ** 300 * 10.0 ** 300) | int }}").find("cannot convert float"), std::string::npos);
  EXPECT_EQ(Render("{{ range(0, 9223372036854775807, 4611686018427387904) | list }}"),
            "[0, 4611686018427387904]");  // the step past int64 ends the range
  EXPECT_EQ(Render("{{ [1, 2, 3][::9223372036854775807] }}"), "[1]");
  // Work without end: loops in loops, recursion without a base case.
  TemplateOptions few_steps;  // (the default, 5M steps, takes a minute to reach under ASan)
  few_steps.max_render_steps = 100000;
  EXPECT_NE(error_of("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}", few_steps)
                .find("more than 100000 steps"),
            std::string::npos);
  EXPECT_EQ(TemplateOptions().max_render_steps, 5'000'000);
  EXPECT_NE(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("calls nested more than 64 deep"),
            std::string::npos);
  // Memory without end: repetition, doubling, replace and indent blow-ups, long lists.
  EXPECT_NE(error_of("{{ 'x' * 9223372036854775807 }}").find("more than 67108864 bytes"), std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}"
                     "{% endfor %}")
                .find("more than 67108864 bytes"),
            std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(s=[1]) %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}"
                     "{% endfor %}")
                .find("list of more than 1048576 items"),
            std::string::npos);
  EXPECT_NE(error_of("{{ ('x' * 10000000) | replace('x', 'yyyyyyyyyyyyyyyyyyyy') }}").find("bytes"), std::string::npos);
  EXPECT_NE(error_of("{{ 'a' | indent(-1) }}").find("indent width"), std::string::npos);  // was a 2^64-byte string
  EXPECT_NE(error_of("{% for i in range(100) %}{{ 'x' * 1000000 }}{% endfor %}").find("bytes"), std::string::npos);
  EXPECT_NE(error_of("{{ range(2000000) | list | length }}").find("list of more than"), std::string::npos);
  // Values nested without end, and a namespace that would hold itself (a cycle: printing it never ended).
  EXPECT_NE(error_of("{% set ns = namespace(x=1) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}"
                     "{{ ns.x }}")
                .find("nested more than 128 deep"),
            std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(x=1) %}{% set ns.x = [ns] %}{{ ns.x | tojson }}")
                .find("a namespace attribute cannot hold a namespace"),
            std::string::npos);
  // A list that holds itself twice per level prints 2^depth times: the printer stops at its bound.
  EXPECT_NE(error_of("{% set ns = namespace(x=[1]) %}{% for i in range(60) %}{% set ns.x = [ns.x, ns.x] %}"
                     "{% endfor %}{{ ns.x }}")
                .find("printed longer than"),
            std::string::npos);
  // The bounds are options: a caller (the fuzz target) may set tighter ones.
  TemplateOptions tight;
  tight.max_render_steps = 100;
  tight.max_output_bytes = 1000;
  EXPECT_NE(error_of("{% for i in range(1000) %}{% endfor %}", tight).find("more than 100 steps"), std::string::npos);
  EXPECT_NE(error_of("{{ 'x' * 1001 }}", tight).find("more than 1000 bytes"), std::string::npos);
  EXPECT_EQ(Render("{{ 'x' * 3 }}", "{}", tight), "xxx");
}

// Values from JSON nest at most kMaxValueNesting deep: deeper input is refused, not recursed into without end.
TEST(JinjaTest, DeepJsonIsRefused) {
  nlohmann::json deep = 1;
  for (int i = 0; i < 200; ++i) deep = nlohmann::json::array({deep});
  EXPECT_THROW(Value::FromJson(deep), std::length_error);
  nlohmann::json ok = 1;
  for (int i = 0; i < 100; ++i) ok = nlohmann::json::array({ok});
  EXPECT_EQ(Value::FromJson(ok).depth(), 100);
}

// `{% set ns.s = ns.s + ... %}` appends in place (DeepSeek-V3's template gathers system messages this way, and the
// copy per message made 8,000 of them take 90 s): the same output and the same errors as evaluating it whole.
TEST(JinjaTest, NamespaceStringAppendIsInPlaceWithTheSameMeaning) {
  const std::string gather =
      "{% set ns = namespace(s='', first=true) %}{% for m in msgs %}{% if ns.first %}"
      "{% set ns.s = ns.s + m %}{% set ns.first = false %}{% else %}{% set ns.s = ns.s + '|' + m %}{% endif %}"
      "{% endfor %}{{ ns.s }}";
  EXPECT_EQ(Render(gather, R"({"msgs": ["a", "bb", "c"]})"), "a|bb|c");
  EXPECT_EQ(Render("{% set ns = namespace(s='x') %}{% set ns.s = ns.s ~ 1 ~ none + 'y' %}{{ ns.s }}"), "x1Noney");
  EXPECT_EQ(Render("{% set ns = namespace(s='ab') %}{% set ns.s = ns.s + ns.s %}{{ ns.s }}"), "abab");
  EXPECT_EQ(Render("{% set ns = namespace(s='a') %}{% set ns.s = ns.s + 1 %}"),
            "ERROR: template 'test', line 1: can only concatenate str (not \"int\") to str");
  EXPECT_EQ(Render("{% set ns = namespace(n=1) %}{% set ns.n = ns.n + 2 %}{{ ns.n }}"), "3");  // not a string
  EXPECT_EQ(Render("{% set ns = namespace(s='a', t='b') %}{% set ns.s = ns.t + 'c' %}{{ ns.s }}"), "bc");
  // 20,000 messages: linear now (each took a copy of the whole string before).
  std::string msgs = "[";
  for (int i = 0; i < 20000; ++i) msgs += std::string(i ? "," : "") + "\"" + std::string(200, 'm') + "\"";
  msgs += "]";
  EXPECT_EQ(Render(gather, R"({"msgs": )" + msgs + "}").size(), 20000 * 201 - 1);
}

}  // namespace
}  // namespace fathom::jinja
