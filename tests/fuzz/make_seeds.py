#!/usr/bin/env python3
"""Writes the seed corpora under tests/fuzz/corpus/<target>/ (committed; rerun after a change here).

Seeds are small and meaningful: real-looking requests, schemas, grammars, a tiny tokenizer.json and a
valid safetensors header, so that libFuzzer starts from inputs that reach deep into each parser.
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tiny_tokenizer():
    alphabet = bytes_to_unicode()
    vocab = {alphabet[b]: i for i, b in enumerate(sorted(alphabet))}
    merges = []
    for pair in [("h", "e"), ("l", "l"), ("he", "ll"), ("Ġ", "w"), ("o", "r")]:
        merges.append(" ".join(pair))
        vocab["".join(pair)] = len(vocab)
    split = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
             "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": len(vocab), "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True},
                         {"id": len(vocab) + 1, "content": "<|im_end|>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }


def tokenizer_seeds():
    texts = ["hello world", "It's 123 naïve Ωmega", "中文分词 한국어 😀👍🏽", "e\u0301 é <|im_end|>\n\r\n\t  x",
             "{\"a\": [1, 2]}\n", ""]
    for i, t in enumerate(texts):
        write("tokenizer_roundtrip", f"text_{i}", b"\x00" + t.encode())
    write("tokenizer_roundtrip", "ids_0", b"\x01" + struct.pack("<12H", *range(250, 262)))
    write("tokenizer_roundtrip", "ids_specials", b"\x01" + struct.pack("<6H", 600, 601, 260, 602, 0xE4, 0xB8))
    tiny = tiny_tokenizer()
    write("tokenizer_json", "tiny_qwen2", json.dumps(tiny, ensure_ascii=False))
    bytelevel = dict(tiny, pre_tokenizer={"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
                     normalizer=None)
    write("tokenizer_json", "tiny_bytelevel", json.dumps(bytelevel))
    write("tokenizer_json", "not_bpe", json.dumps(dict(tiny, model={"type": "WordPiece", "vocab": {}})))


def openai_seeds():
    completion = {"model": "m", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0.7, "top_p": 0.9,
                  "n": 2, "stop": ["\n\n"], "seed": 7, "logprobs": 2, "stream": True,
                  "stream_options": {"include_usage": True}}
    chat = {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": "Hi! Name a colour."}],
            "max_completion_tokens": 8, "top_k": 20, "frequency_penalty": 0.5, "logit_bias": {"12": -100}}
    guided = {"prompt": "JSON:", "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {
        "type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
        "required": ["name"]}}}}
    regex = {"prompt": [[1, 2, 3], [4, 5]], "guided_regex": "[a-z]+@[a-z]+\\.com", "echo": True}
    grammar = {"prompt": "x", "structured_outputs": {"grammar": "root ::= \"yes\" | \"no\""}}
    tools = {"messages": [{"role": "user", "content": "weather?"}], "tools": [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "tool_choice": "auto"}
    write("openai_request", "completion", b"\x00" + json.dumps(completion).encode())
    write("openai_request", "chat", b"\x01" + json.dumps(chat).encode())
    write("openai_request", "guided_schema", b"\x00" + json.dumps(guided).encode())
    write("openai_request", "guided_regex_token_prompts", b"\x00" + json.dumps(regex).encode())
    write("openai_request", "guided_grammar", b"\x00" + json.dumps(grammar).encode())
    write("openai_request", "chat_tools", b"\x01" + json.dumps(tools).encode())
    write("openai_request", "tokenize", b"\x02" + json.dumps({"prompt": "hello world"}).encode())
    write("openai_request", "detokenize", b"\x03" + json.dumps({"tokens": [1, 2, 300]}).encode())
    responses = {"model": "m", "instructions": "Be brief.", "max_output_tokens": 16, "temperature": 0.7,
                 "input": [{"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                           {"type": "function_call", "call_id": "c1", "name": "get_weather",
                            "arguments": "{\"city\": \"Oslo\"}"},
                           {"type": "function_call_output", "call_id": "c1", "output": "sunny"}],
                 "tools": [{"type": "function", "name": "get_weather",
                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
                 "text": {"format": {"type": "json_schema", "name": "a",
                                     "schema": {"type": "object", "properties": {"x": {"type": "integer"}}}}}}
    write("openai_request", "responses", b"\x04" + json.dumps(responses).encode())


def schema_seeds():
    schemas = {
        "object": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                                    "tags": {"type": "array", "items": {"type": "string"},
                                                             "maxItems": 3}},
                   "required": ["name"], "additionalProperties": False},
        "enum_const": {"anyOf": [{"enum": ["red", "green", 3, None]}, {"const": {"a": 1}}]},
        "numbers": {"type": "object", "properties": {"n": {"type": "integer", "minimum": -5, "maximum": 120},
                                                     "x": {"type": "number", "exclusiveMinimum": 0.5}}},
        "pattern_format": {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2}[0-9]+$"},
                                                            "when": {"type": "string", "format": "date-time"}}},
        "refs": {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "boolean"}}}},
                 "type": "array", "prefixItems": [{"$ref": "#/$defs/node"}], "items": {"type": "null"}},
        "tagged_union": {"oneOf": [
            {"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}, "required": ["kind"]},
            {"type": "object", "properties": {"kind": {"const": "b"}, "y": {"type": "string"}}, "required": ["kind"]}]},
    }
    for name, s in schemas.items():
        write("json_schema", name, json.dumps(s))
    write("json_schema", "any", "{}")


def regex_seeds():
    for name, p, text in [("email", "[a-z0-9._]+@[a-z]+\\.(com|org)", "a.b@x.com"),
                          ("repeat", "(ab|c){2,5}d?", "ababc"), ("classes", "\\d{3}-\\w+\\s*[^x-z]", "123-ab q"),
                          ("anchors", "^(yes|no)$", "no"), ("unicode", "[é中]+.", "é中x"),
                          ("escapes", "\\.\\*\\?\\[\\]\\(\\)\\{\\}\\\\", ".*?[](){}\\")]:
        write("regex", name, p.encode() + b"\x00" + text.encode())


def grammar_seeds():
    grammars = {
        "yes_no": ('root ::= "yes" | "no"', "yes"),
        "json": ('root ::= value\nvalue ::= object | array | string | number | "true" | "false" | "null"\n'
                 'object ::= "{" ws ( string ws ":" ws value ( ws "," ws string ws ":" ws value )* )? ws "}"\n'
                 'array ::= "[" ws ( value ( ws "," ws value )* )? ws "]"\n'
                 'string ::= "\\"" [^"\\\\]* "\\""\nnumber ::= "-"? [0-9]+ ("." [0-9]+)?\nws ::= [ \\t\\n]*\n',
                 '{"a": [1, "x", {"b": null}]}'),
        "arith": ('root ::= expr\nexpr ::= term ("+" term)*\nterm ::= factor ("*" factor)*\n'
                  'factor ::= [0-9]+ | "(" expr ")"\n', "(1+2)*3"),
        "quantifiers": ('# a comment\nroot ::= item{2,4} "." [a-c]? \\\n  "\\x41\\u00e9"\nitem ::= [^\\n]', "abc.aAé"),
        "left_recursive": ('root ::= root "a" | "b"', "ba"),
    }
    for name, (g, text) in grammars.items():
        write("ebnf_grammar", name, g.encode() + b"\x00" + text.encode())


def safetensors_seeds():
    def file(header, data):
        h = json.dumps(header).encode()
        return struct.pack("<Q", len(h)) + h + data
    write("safetensors_header", "two_tensors", file(
        {"__metadata__": {"format": "pt"},
         "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
         "b": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]}}, bytes(32)))
    write("safetensors_header", "f16_scalar", file({"s": {"dtype": "F16", "shape": [], "data_offsets": [0, 2]}},
                                                   bytes(2)))
    write("safetensors_header", "empty_and_i64", file(
        {"e": {"dtype": "F32", "shape": [0, 5], "data_offsets": [0, 0]},
         "i": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}}, bytes(8)))


def request_seeds():
    # ferry.v1.GenerateRequest, hand-encoded: request_id (1), text (2), sampling (4) with
    # max_tokens (1) and temperature, lane (5). Field numbers follow proto/ferry/v1/*.proto.
    def key(field, wire):
        return bytes([(field << 3) | wire])

    def ld(field, payload):
        return key(field, 2) + bytes([len(payload)]) + payload
    write("generate_request", "text_only", ld(1, b"req-1") + ld(2, b"Hello there"))
    write("generate_request", "token_ids", ld(3, key(1, 2) + bytes([3, 1, 2, 3])))  # packed ids 1, 2, 3
    write("generate_request", "with_lane", ld(2, b"Summarise this.") + ld(5, b"batch"))
    sampling = (key(1, 0) + bytes([8]) + key(2, 5) + struct.pack("<f", 0.7) + key(4, 0) + bytes([20]) +
                key(5, 0) + bytes([42]) + ld(6, b"\n\n") + key(7, 0) + bytes([2]) + key(10, 5) + struct.pack("<f", 0.5))
    write("generate_request", "sampling", ld(1, b"req-2") + ld(2, b"Tell me a story") + ld(4, sampling))


def jinja_seeds():
    here = os.path.dirname(os.path.abspath(__file__))
    source = open(os.path.join(here, "..", "..", "gateway", "tokenizer", "tokenizer_config.cc")).read()
    qwen = source[source.index('R"JINJA(') + len('R"JINJA('):source.index(')JINJA"')]
    write("jinja_template", "qwen25", qwen.encode())
    write("jinja_template", "macros_loops",
          b"{% macro m(a, b=2) %}{{ a * b }}{% endmacro %}{% set ns = namespace(n=0) %}"
          b"{% for x in messages|selectattr('role', 'ne', 'tool') if x.content %}{% set ns.n = ns.n + 1 %}"
          b"{{ loop.index }}{{ m(loop.length) }}{% if loop.last %}{% break %}{% endif %}{% else %}none{% endfor %}"
          b"{{ ns.n }}{{ messages[::-1][0].content.split(' ')|join('-')|upper|trim }}")
    write("jinja_template", "whitespace_control",
          b"a\n  {%- if bos_token -%}\n {{ bos_token }}\n  {%+ endif %}\n{# c #}\n  {% set x = 'y' %}\n{{- x ~ 1 -}}")
    write("jinja_template", "tojson_vars",
          b"{{ tools|tojson(indent=2) }}{{ messages[2].tool_calls[0].function.arguments|items|list }}"
          b"{% set b %}{{ 'x' * 3 }}{% endset %}{{ b|length }}\x00"
          b'{"tools": [{"a": [1, {"b": null}]}], "messages": [0, 1, {"tool_calls": [{"function": {"arguments": {"k": 1}}}]}]}')


if __name__ == "__main__":
    jinja_seeds()
    tokenizer_seeds()
    openai_seeds()
    schema_seeds()
    regex_seeds()
    grammar_seeds()
    safetensors_seeds()
    request_seeds()
