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

}  // namespace
}  // namespace fathom::jinja
