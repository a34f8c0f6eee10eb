// The engine's bounds and error reporting. Its semantics are checked against jinja2 itself
// (tests/python/test_jinja_parity.py); what no jinja2 comparison can show is here: a hostile
// template ends with an Error naming the limit, fast, and errors carry the template's line.
#include "gateway/jinja/template.h"

#include <gtest/gtest.h>

namespace ferry::gateway::jinja {
namespace {

std::string Render(const std::string& source, const nlohmann::ordered_json& vars = nlohmann::ordered_json::object(),
                   Limits limits = Limits()) {
  auto t = Template::Parse(source, limits);
  if (auto* e = std::get_if<Error>(&t)) return "PARSE ERROR line " + std::to_string(e->line) + ": " + e->message;
  const Value v = Value::FromJson(vars);
  auto out = std::get<Template>(t).Render(v.dict());
  if (auto* e = std::get_if<Error>(&out)) return "ERROR line " + std::to_string(e->line) + ": " + e->message;
  return std::get<std::string>(out);
}

bool Contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(JinjaTest, PrintsAndConcatenates) {
  EXPECT_EQ(Render("{{ 'a' + 'b' }}|{{ 1 + 2 * 3 }}|{{ none }}|{{ x }}", {{"x", "y"}}), "ab|7|None|y");
}

TEST(JinjaTest, ErrorsNameTheirLine) {
  EXPECT_EQ(Render("a\nb\n{{ 1 + 'x' }}"), "ERROR line 3: unsupported operand type(s) for +: 'int' and 'str'");
  EXPECT_EQ(Render("\n{{ raise_exception('bad roles') }}"), "ERROR line 2: bad roles");
  EXPECT_TRUE(Contains(Render("x\n\n{% include 'y' %}"), "PARSE ERROR line 3: the statement '{% include %}'"));
}

TEST(JinjaTest, StepsAreBounded) {
  Limits limits;
  limits.max_steps = 100'000;
  const std::string r = Render("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}",
                               nlohmann::ordered_json::object(), limits);
  EXPECT_TRUE(Contains(r, "limit of 100000 steps")) << r;
}

TEST(JinjaTest, ValuesAndOutputAreBoundedBeforeTheyAllocate) {
  EXPECT_TRUE(Contains(Render("{{ 'x' * 1000000000000 }}"), "passed the template engine's limit")) << "repetition";
  EXPECT_TRUE(Contains(Render("{{ range(1000000000000)|length }}"), "a list passed")) << "range";
  EXPECT_TRUE(Contains(Render("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}"
                              "{% set ns.s = ns.s + ns.s %}{% endfor %}"),
                       "a string passed"))
      << "doubling";
  Limits small;
  small.max_output_bytes = 1000;
  EXPECT_TRUE(Contains(Render("{% for i in range(10000) %}abc{% endfor %}", nlohmann::ordered_json::object(), small),
                       "the output passed"));
  EXPECT_TRUE(Contains(Render("{{ 2 ** 64 }}"), "integer overflow"));
}

TEST(JinjaTest, NestingAndRecursionAreBounded) {
  const std::string deep = std::string(1000, '(') + "1" + std::string(1000, ')');
  EXPECT_TRUE(Contains(Render("{{ " + deep + " }}"), "nests deeper than"));
  EXPECT_TRUE(Contains(Render("{{ " + std::string(5000, '-') + "1 }}"), "nests deeper than")) << "unary chains";
  std::string ifs;
  for (int i = 0; i < 1000; ++i) ifs += "{% if true %}";
  EXPECT_TRUE(Contains(Render(ifs), "nests deeper than"));
  EXPECT_TRUE(Contains(Render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"), "deeper than the template engine's limit"));
}

TEST(JinjaTest, ChainsAndBuiltValuesAreBounded) {
  std::string sum = "1";
  for (int i = 0; i < 5000; ++i) sum += "+1";
  EXPECT_TRUE(Contains(Render("{{ " + sum + " }}"), "an expression nests deeper than")) << "a loop-built chain";
  std::string attrs = "x";
  for (int i = 0; i < 5000; ++i) attrs += ".a";
  EXPECT_TRUE(Contains(Render("{{ " + attrs + " }}"), "an expression nests deeper than"));
  EXPECT_TRUE(Contains(Render("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}"
                              "{% endfor %}{{ ns.x }}"),
                       "a value nests deeper than 256"));
  EXPECT_TRUE(Contains(Render("{% set ns = namespace(a=1) %}{% set ns.self = [ns] %}"), "namespace holding a namespace"));
}

TEST(JinjaTest, SandboxRefusesMutation) {
  EXPECT_TRUE(Contains(Render("{{ l.append(1) }}", {{"l", nlohmann::ordered_json::array()}}), "unsafe"));
  EXPECT_EQ(Render("{% set ns = namespace(a=1) %}{% set ns.a = ns.a + 1 %}{{ ns.a }}"), "2") << "a namespace is the exception";
}

TEST(JinjaTest, RefusesTextThatIsNotUtf8) {
  EXPECT_TRUE(Contains(Render("ok \xff"), "not UTF-8"));
}

}  // namespace
}  // namespace ferry::gateway::jinja
