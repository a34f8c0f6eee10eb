"""Ferry's Jinja subset (gateway/jinja) against Python's jinja2, configured as transformers'
apply_chat_template configures it: the same template and variables must give byte-identical
text, or both must fail (with the same message when the template raises it). Hand-written cases
cover each served construct; a seeded generator adds expressions that combine them; a third set
checks that what is not served is refused at parse time, naming the construct and its line."""

import json
import os
import random
import subprocess
from datetime import datetime

import pytest

jinja2 = pytest.importorskip("jinja2")
import jinja2.ext  # noqa: E402
import jinja2.nodes  # noqa: E402
from jinja2.ext import loopcontrols  # noqa: E402
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

BUILD = os.environ.get("FERRY_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build"))
FERRY_JINJA = os.path.join(BUILD, "bin", "ferry-jinja")


class GenerationTag(jinja2.ext.Extension):
    """transformers' AssistantTracker tag, as it renders when no mask is asked for: the body as is."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def transformers_env():
    """transformers' _compile_jinja_template environment (utils/chat_template_utils.py)."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def reference(template, variables):
    try:
        return {"output": transformers_env().from_string(template).render(**variables)}
    except jinja2.exceptions.TemplateError as e:  # raise_exception, syntax, undefined, security
        return {"error": str(e), "raised": type(e) is jinja2.exceptions.TemplateError}
    except Exception as e:  # TypeError, ValueError, ... from Python itself
        return {"error": str(e), "raised": False}


def ferry(cases):
    if not os.path.exists(FERRY_JINJA):
        pytest.skip(f"{FERRY_JINJA} not built (set FERRY_BUILD_DIR)")
    lines = "".join(json.dumps({"template": t, "variables": v}) + "\n" for t, v in cases)
    out = subprocess.run([FERRY_JINJA], input=lines, capture_output=True, text=True, timeout=120, check=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


MESSAGES = [
    {"role": "system", "content": "  Be brief.  "},
    {"role": "user", "content": "Hi <b>there</b> — ünïcödé 🙂"},
    {"role": "assistant", "content": "Hello!", "tool_calls": [{"id": "abc123XYZ", "type": "function",
                                                               "function": {"name": "f", "arguments": {"x": 1, "y": [True, None, 1.5]}}}]},
    {"role": "tool", "content": "{\"ok\": true}", "tool_call_id": "abc123XYZ"},
]
VARS = {"messages": MESSAGES, "n": 7, "f": 2.5, "s": "  a,b,,c  ", "e": "", "l": [3, 1, 2], "d": {"b": 2, "a": 1},
        "none_value": None, "t": True, "u": "é🙂x"}

CASES = [
    # output, literals, whitespace control (trim_blocks, lstrip_blocks, -, +)
    "{{ 'a' }}{{ \"b\" }}{{ 1 }}{{ 1.0 }}{{ 1e20 }}{{ 1.5e-7 }}{{ 0.1 }}{{ 123456789012345678.0 }}{{ true }}{{ none }}",
    "{{ [1, 'a', none, true, 1.5, [2], {'k': 'v'}] }}|{{ {'a': 1, 'b': [none]} }}|{{ ('x', 1) }}|{{ () }}",
    "{{ 'it\\'s' }}|{{ \"say \\\"hi\\\"\" }}|{{ ['it\\'s', \"a\\\"b\", 'tab\\there', 'nl\\n'] }}",
    "a\n  {% if t %}\n  yes\n  {% endif %}\nb\n",
    "a  {%- if t -%}  yes  {%- endif -%}  b",
    "a\n  {%+ if t %}x{% endif +%}\nb",
    "  {# comment #}\nline\n{#- c -#}\n  tail",
    "{{ n }}\n{{ n }}\n\n",
    "x {% if t %}\r\ny{% endif %}\r\n",
    "{% for m in messages %}\n  {{ m.role }}\n{% endfor %}\n",
    "{%- for m in messages -%}\n  [{{ m.role }}]\n{%- endfor %}",
    # operators
    "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2.0 ** 0.5 }}",
    "{{ 'ab' * 3 }} {{ 3 * 'x' }} {{ [1] * 2 }} {{ 'a' ~ 1 ~ none ~ true }} {{ 1 + 2.5 }} {{ true + 1 }}",
    "{{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 'é' > 'z' }} {{ none == none }}",
    "{{ 'a' in 'cat' }} {{ 2 in l }} {{ 'a' in d }} {{ 'z' not in d }} {{ not 0 }} {{ not e }} {{ l and 'x' }} {{ e or 'dflt' }}",
    "{{ 'y' if t else 'n' }} {{ 'y' if not t else 'n' }} {{ ('a' if e) ~ '|' }}",
    "{{ -n }} {{ +f }} {{ - -n }} {{ n - 10 }} {{ f * 2 }} {{ 10 / 4 }} {{ 1 - 0.9 }}",
    # lookups, slices, methods
    "{{ messages[0]['role'] }} {{ messages[0].role }} {{ messages[-1].tool_call_id }} {{ messages[9] is defined }}",
    "{{ messages[1:] | length }} {{ l[::-1] }} {{ l[1:] }} {{ l[:-1] }} {{ l[::2] }} {{ u[1:] }} {{ u[::-1] }} {{ u[-1] }}",
    "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.strip(' a') }}|{{ s.split(',') }}|{{ s.split() }}|{{ s.split(',', 1) }}",
    "{{ 'a b  c'.split(' ') }} {{ 'a\\nb\\r\\nc'.splitlines() }} {{ 'x'.upper() }} {{ 'ÉA'.lower() }} {{ 'hello world'.title() }}",
    "{{ 'abc'.startswith('a') }} {{ 'abc'.endswith('bc') }} {{ 'abc'.startswith(('x', 'ab')) }} {{ 'aaa'.replace('a', 'b', 2) }}",
    "{{ 'abcabc'.find('c') }} {{ 'abcabc'.rfind('c') }} {{ 'abc'.find('z') }} {{ 'aXbXc'.count('X') }} {{ '-'.join(['a', 'b']) }}",
    "{{ '</think>x'.split('</think>')[-1].lstrip('\\n') }} {{ 'abc'.removeprefix('a') }} {{ 'abc'.removesuffix('c') }}",
    "{{ '12'.isdigit() }} {{ 'ab'.isalpha() }} {{ ' '.isspace() }} {{ 'ab'.islower() }} {{ 'AB'.isupper() }} {{ 'hi there'.capitalize() }}",
    "{{ d.items() | list }} {{ d.keys() | list }} {{ d.values() | list }} {{ d.get('a') }} {{ d.get('z', 5) }} {{ d.get('z') }}",
    "{{ l.index(1) }} {{ l.count(3) }} {{ messages[2].tool_calls[0].function.arguments.y }}",
    "{{ messages[0].nope }}|{{ none_value.x }}|{{ 'x'.nope }}",
    # filters
    "{{ s|trim }}|{{ s|trim(' a') }}|{{ l|length }} {{ 'é🙂'|length }} {{ d|count }} {{ l|first }} {{ l|last }} {{ u|first }}",
    "{{ l|join(', ') }} {{ messages|map(attribute='role')|join }} {{ messages|map(attribute='nope', default='z')|list }}",
    "{{ messages|selectattr('role', 'equalto', 'user')|list|length }} {{ messages|rejectattr('role', 'in', ['tool', 'system'])|map(attribute='role')|list }}",
    "{{ l|select('odd')|list }} {{ l|reject('even')|list }} {{ [0, 1, '', 'a']|select|list }} {{ l|map('string')|list }}",
    "{{ ['b', 'A', 'c']|sort }} {{ l|sort(reverse=true) }} {{ messages|sort(attribute='role')|map(attribute='role')|join(',') }}",
    "{{ d|dictsort }} {{ d|items|list }} {{ d|list }} {{ 'ab'|list }} {{ l|reverse|list }} {{ 'abc'|reverse }}",
    "{{ 'x'|upper }} {{ 'X'|lower }} {{ 'hello-world foo'|title }} {{ 'hELLO'|capitalize }} {{ 'a<b>&\"'|e }} {{ 'q'|safe }}",
    "{{ none_value|default('d') }} {{ nope|default('d') }} {{ e|default('d', true) }} {{ nope|d('x') }} {{ 0|default(5) }}",
    "{{ '12'|int }} {{ '1.9'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 2.7|int }} {{ '2.5'|float }} {{ 'q'|float }} {{ 3|float }}",
    "{{ l|sum }} {{ l|max }} {{ l|min }} {{ [1, 2, 1, 3]|unique|list }} {{ ['a', 'A']|unique|list }} {{ -3|abs }} {{ 2.567|round(2) }}",
    "{{ 'a b\\nc d'|wordcount }} {{ 'line1\\nline2\\n\\nline4'|indent(2) }}|{{ 'l1\\nl2'|indent(2, true) }}",
    "{{ 'aXbX'|replace('X', '-') }} {{ 'x'|string }} {{ 5|string }} {{ [1]|string }} {{ none|string }}",
    "{{ messages[2].tool_calls[0].function|tojson }}",
    "{{ messages|tojson }}",
    "{{ d|tojson(indent=4) }}|{{ l|tojson(indent=2) }}|{{ {}|tojson(indent=2) }}|{{ []|tojson }}",
    "{{ u|tojson }} {{ u|tojson(ensure_ascii=true) }} {{ '\\u0001\\t\"\\\\'|tojson }} {{ f|tojson }} {{ 1e100|tojson }}",
    "{{ d|tojson(sort_keys=true) }} {{ d|tojson(separators=(',', ':')) }} {{ none|tojson }} {{ t|tojson }}",
    # tests
    "{{ n is number }} {{ f is float }} {{ n is integer }} {{ t is boolean }} {{ t is number }} {{ s is string }} {{ d is mapping }}",
    "{{ l is iterable }} {{ s is iterable }} {{ d is iterable }} {{ n is iterable }} {{ nope is iterable }} {{ l is sequence }}",
    "{{ nope is defined }} {{ nope is undefined }} {{ none_value is none }} {{ nope is none }} {{ nope is not none }} {{ t is true }}",
    "{{ n is odd }} {{ n is even }} {{ n is divisibleby 7 }} {{ n is divisibleby(2) }} {{ 'x' is in 'xyz' }} {{ 3 is eq 3 }}",
    "{{ 3 is gt 2 }} {{ 3 is ge 4 }} {{ 'ab' is lower }} {{ 'AB' is upper }} {{ n is equalto 7 }} {{ n is ne 7 }} {{ range is callable }}",
    # statements
    "{% set x = 3 %}{% set y, z = 1, 2 %}{{ x + y + z }}{% set w = [1, 2] %}{% set a, b = w %}{{ a }}{{ b }}",
    "{% for i in range(3) %}{{ i }}{% endfor %}|{% for i in range(1, 10, 3) %}{{ i }}{% endfor %}|{% for i in range(5, 0, -2) %}{{ i }}{% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
    "{% for c in u %}[{{ c }}]{% endfor %}{% for x in [] %}x{% else %}empty{% endfor %}{% for x in nope %}x{% endfor %}",
    "{% for m in messages if m.role != 'tool' %}{{ loop.index }}/{{ loop.length }}:{{ m.role }} {% endfor %}",
    "{% for i in l %}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('a', 'b') }}|{% endfor %}",
    "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% set x = 1 %}{% for i in l %}{% set x = i %}[{{ x }}]{% endfor %}{{ x }}",
    "{% for i in [1, 2] %}[{{ y }}]{% set y = i %}{% endfor %}{{ y }}",
    "{% if t %}{% set x = 5 %}{% endif %}{{ x }}",
    "{% set ns = namespace(count=0, found=false) %}{% for i in l %}{% set ns.count = ns.count + i %}{% if i == 1 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }}",
    "{% set ns = namespace() %}{% set ns.a = 'x' %}{{ ns.a }}{{ ns.b is defined }}",
    "{% macro greet(name, punct='!') %}Hello {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', '?') }} {{ greet(name='c', punct='.') }}",
    "{% macro rec(k) %}{% if k > 0 %}{{ k }}{{ rec(k - 1) }}{% endif %}{% endmacro %}{{ rec(4) }}",
    "{% set block %}inner {{ n }}{% endset %}[{{ block }}]",
    "{% if n > 10 %}big{% elif n > 5 %}mid{% else %}small{% endif %}",
    "{% generation %}gen {{ n }}{% endgeneration %}",
    "{% for m in messages %}{% if m.role == 'assistant' and m.tool_calls is defined %}{% for tc in m.tool_calls %}{{ tc.function.name }}({{ tc.function.arguments|tojson }}){% endfor %}{% endif %}{% endfor %}",
    "{{ messages[0]['content']|trim + '\\n\\n' }}",
    "{% for key, val in messages[2].tool_calls[0].function.items() if key != 'name' %}{{ key }}:{{ val|tojson }}{% endfor %}",
    "{{ (messages|selectattr('role', 'equalto', 'user')|list)[-1] == messages[1] }} {{ messages[0] == messages[1] }}",
    # errors: both must fail
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}",
    "{{ nope.attr }}",
    "{{ 1 + 'a' }}",
    "{{ 'a' + 1 }}",
    "{{ nope + 1 }}",
    "{{ 1 / 0 }}",
    "{{ 1 < 'a' }}",
    "{{ n() }}",
    "{{ l.append(4) }}",
    "{{ d.update({}) }}",
    "{{ n|length }}",
    "{{ 3 in 5 }}",
    "{% for a, b in l %}{% endfor %}",
    "{% if %}{% endif %}",
    "{{ 1 +  }}",
    "{% for x in l %}",
    "{{ 'abc",
    "{% endif %}",
    "{{ l[1:2:0] }}",
    "{{ none_value|items|list }}",
]


def test_hand_written_cases_match_jinja2():
    cases = [(t, VARS) for t in CASES]
    got = ferry(cases)
    failures = []
    for (template, variables), mine in zip(cases, got):
        want = reference(template, variables)
        if "output" in want:
            if mine.get("output") != want["output"]:
                failures.append(f"{template!r}\n  jinja2: {want['output']!r}\n  ferry:  {mine}")
        elif "error" not in mine:
            failures.append(f"{template!r}\n  jinja2 raised {want['error']!r}\n  ferry:  {mine}")
        elif want["raised"] and mine["error"] != want["error"]:
            failures.append(f"{template!r}\n  raise_exception {want['error']!r}\n  ferry:  {mine}")
    assert not failures, f"{len(failures)} of {len(cases)} differ:\n" + "\n".join(failures)


# Seeded expressions over the served operators, filters and tests: what no hand-written case
# thought to combine.
ATOMS = ["n", "f", "s", "e", "l", "d", "t", "u", "none_value", "nope", "0", "1", "-2", "2.5", "'ab'", "''", "[1, 2]",
         "[]", "{'k': 1}", "true", "false", "none", "messages[1]", "messages|length", "l[0]", "d.a"]
BINARY = ["+", "-", "*", "//", "%", "~", "==", "!=", "<", ">=", "in", "not in", "and", "or"]
FILTERS = ["length", "string", "list", "first", "last", "trim", "upper", "tojson", "int", "float", "default('x')",
           "join(',')", "reverse|list", "sort", "unique|list", "abs", "items|list", "capitalize"]
TESTS = ["defined", "none", "string", "number", "iterable", "mapping", "sequence", "integer", "odd", "true"]


def gen_expr(rng, depth):
    if depth == 0 or rng.random() < 0.3:
        return rng.choice(ATOMS)
    kind = rng.randrange(6)
    if kind == 0:
        return f"({gen_expr(rng, depth - 1)} {rng.choice(BINARY)} {gen_expr(rng, depth - 1)})"
    if kind == 1:
        return f"({gen_expr(rng, depth - 1)}|{rng.choice(FILTERS)})"
    if kind == 2:
        neg = "not " if rng.random() < 0.3 else ""
        return f"({gen_expr(rng, depth - 1)} is {neg}{rng.choice(TESTS)})"
    if kind == 3:
        return f"(not {gen_expr(rng, depth - 1)})"
    if kind == 4:
        return f"({gen_expr(rng, depth - 1)} if {gen_expr(rng, depth - 1)} else {gen_expr(rng, depth - 1)})"
    return f"[{gen_expr(rng, depth - 1)}, {gen_expr(rng, depth - 1)}][{rng.choice(['0', '-1', '1:', '::-1'])}]"


def test_generated_expressions_match_jinja2():
    rng = random.Random(20261206)
    cases = [("{{ " + gen_expr(rng, 3) + " }}", VARS) for _ in range(2000)]
    got = ferry(cases)
    failures = []
    unserved = 0
    for (template, variables), mine in zip(cases, got):
        want = reference(template, variables)
        if "not served" in mine.get("error", ""):  # refused by name (str % value): never a wrong text
            unserved += 1
            continue
        if "output" in want and mine.get("output") != want["output"]:
            failures.append(f"{template}\n  jinja2: {want['output']!r}\n  ferry:  {mine}")
        elif "error" in want and "error" not in mine:
            failures.append(f"{template}\n  jinja2 raised {want['error']!r}\n  ferry:  {mine}")
    assert not failures, f"{len(failures)} of {len(cases)} differ:\n" + "\n".join(failures[:30])
    assert unserved < len(cases) // 50, f"{unserved} of {len(cases)} refused as not served"


REFUSED = [
    ("line one\n{% include 'other.jinja' %}", "include", 2),
    ("{% extends 'base' %}", "extends", 1),
    ("{% import 'm' as m %}", "import", 1),
    ("{% raw %}x{% endraw %}", "raw", 1),
    ("{% call m() %}x{% endcall %}", "call", 1),
    ("{% filter upper %}x{% endfilter %}", "filter", 1),
    ("{% with a = 1 %}{% endwith %}", "with", 1),
    ("\n\n{{ x|pprint }}", "pprint", 3),
    ("{{ x is sameas_unknown }}", "sameas_unknown", 1),
    ("{% for x in l recursive %}{% endfor %}", "recursive", 1),
    ("{{ f(*args) }}", "*args", 1),
    ("{{ 1 < 2 < 3 }}", "chained", 1),
]


@pytest.mark.parametrize("template,construct,line", REFUSED)
def test_unserved_constructs_are_refused_naming_them(template, construct, line):
    (mine,) = ferry([(template, {})])
    assert "error" in mine, mine
    assert construct in mine["error"], mine
    assert mine["line"] == line, mine
