"""Guided decoding (structured output) through the whole stack, over gRPC and the OpenAI API.

The tiny random model writes gibberish, which is the point: whatever its logits and biases, a
guided request's text is what its constraint accepts. A logit_bias of +100 on '}' (and -100 on
every token with a quote, so no key is opened) makes the unguided text '}}}}...' and the
JSON-guided one exactly '{}' after at most 32 bytes of whitespace (the brace cannot come first,
and after '{' the object may close); a choice request's text is always one of its choices.
"""
import json
import re
import subprocess

import grpc
import pytest

from conftest import REPO, Stack, binary, post_json as post, serve

tokenizers = pytest.importorskip("tokenizers")

EOS = 3  # ferry.v1.FINISH_REASON_EOS
CHOICES = ["red", "green", "blue sky", "{\"x\": 1}"]


@pytest.fixture(scope="module")
def guided_stack(tiny_model, tmp_path_factory):
    yield from serve(Stack(tiny_model, tmp_path_factory.mktemp("guided-stack"), ["--http-port", "0"]))


@pytest.fixture(scope="module")
def gen(guided_stack, ferry_pb):
    channel = grpc.insecure_channel(guided_stack.gateway)
    stub = ferry_pb.gen_grpc.GenerationStub(channel)

    def generate(prompt: str, **sampling):
        req = ferry_pb.gen.GenerateRequest(text=prompt.encode(), sampling=ferry_pb.gen.SamplingParams(**sampling))
        return stub.Generate(req, timeout=60)

    yield generate
    channel.close()


@pytest.fixture(scope="module")
def close_brace(tiny_model):
    return tokenizers.Tokenizer.from_file(str(tiny_model / "tokenizer.json")).token_to_id("}")


@pytest.fixture(scope="module")
def only_close(tiny_model, close_brace):
    """A logit_bias that makes '}' the likeliest token and bans every token with a quote."""
    tok = tokenizers.Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    quotes = [i for i in range(tok.get_vocab_size()) if '"' in tok.decode([i])]
    assert 0 < len(quotes) < 200
    return {close_brace: 100.0, **{i: -100.0 for i in quotes}}


def test_json_object_wins_over_the_bias(gen, only_close):
    free = gen("Once upon a time", max_tokens=6, temperature=0.0, logit_bias=only_close)
    assert free.text == "}" * 6
    guided = gen("Once upon a time", max_tokens=64, temperature=0.0, logit_bias=only_close,
                 guided={"json_object": True})
    assert guided.finish_reason == EOS, guided
    assert json.loads(guided.text) == {} and guided.text.strip() == "{}"


def test_sampled_json_texts_that_end_are_objects(gen, close_brace):
    ended = 0
    for seed in range(12):
        r = gen(f"Write JSON {seed}", max_tokens=96, temperature=1.0, seed=seed, guided={"json_object": True},
                logit_bias={close_brace: 2.0})
        if r.finish_reason == EOS:
            ended += 1
            assert isinstance(json.loads(r.text), dict), r.text
        else:
            assert r.text.lstrip().startswith("{"), r.text
    assert ended >= 3, "with '}' favoured, most sampled objects should close within 96 tokens"


def test_choice_texts_are_exactly_a_choice(gen):
    seen = set()
    for seed in range(10):
        r = gen("Pick a colour", max_tokens=32, temperature=1.2, seed=seed, guided={"choice": {"choices": CHOICES}})
        assert r.finish_reason == EOS and r.text in CHOICES, r
        seen.add(r.text)
    assert len(seen) >= 2


# Required properties in the schema's order ("verdict" before "confidence"), an enum and an integer.
VERDICT = {"type": "object", "additionalProperties": False, "required": ["verdict", "confidence"],
           "properties": {"verdict": {"enum": ["yes", "no", "unsure"]}, "confidence": {"type": "integer"},
                          "notes": {"type": "array", "items": {"type": "string"}, "maxItems": 2}}}


def check_verdict(text):
    value = json.loads(text)
    assert list(value)[:2] == ["verdict", "confidence"], text  # in the schema's order
    assert value["verdict"] in ("yes", "no", "unsure") and isinstance(value["confidence"], int), text


def test_json_schema_texts_validate(gen, close_brace):
    # '}' favoured: once the integer has a digit, the object closes (notes is optional).
    for seed in range(4):
        r = gen("Is it raining?", max_tokens=200, temperature=1.0, seed=seed, logit_bias={close_brace: 100.0},
                guided={"json_schema": json.dumps(VERDICT)})
        assert r.finish_reason == EOS, r
        check_verdict(r.text)


PHONE = r"\(\d{3}\) \d{3}-\d{4}( ext\. \d{1,4})?"


def test_regex_texts_match_whole(gen, guided_stack):
    for seed in range(6):
        r = gen("Call me at", max_tokens=40, temperature=1.0, seed=seed, guided={"regex": PHONE})
        assert r.finish_reason == EOS and re.fullmatch(PHONE, r.text), r
    status, body = post(guided_stack, "/v1/completions",
                        {"prompt": "Call me at", "max_tokens": 40, "seed": 1, "n": 2, "guided_regex": PHONE})
    assert status == 200 and all(re.fullmatch(PHONE, c["text"]) for c in body["choices"]), body
    status, body = post(guided_stack, "/v1/completions",
                        {"prompt": "x", "max_tokens": 4, "structured_outputs": {"regex": "(a)\\1"}})
    assert status == 400 and body["error"]["param"] == "structured_outputs.regex", body
    assert "backreferences" in body["error"]["message"], body


# vLLM's guided_grammar example, and the regex of the same language.
SQL_GRAMMAR = """root ::= select_statement
select_statement ::= "SELECT " column " from " table " where " condition
column ::= "col_1 " | "col_2 "
table ::= "table_1 " | "table_2 "
condition ::= column "= " number
number ::= "1 " | "2 "
"""
SQL = r"SELECT col_[12]  from table_[12]  where col_[12] = [12] "


def test_grammar_texts_are_in_its_language(gen, guided_stack, tmp_path):
    for seed in range(4):
        r = gen("Query:", max_tokens=64, temperature=1.0, seed=seed, guided={"grammar": SQL_GRAMMAR})
        assert r.finish_reason == EOS and re.fullmatch(SQL, r.text), r
    status, body = post(guided_stack, "/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "SQL please"}], "max_tokens": 64, "seed": 5,
                         "temperature": 1.0, "guided_grammar": SQL_GRAMMAR})
    assert status == 200 and re.fullmatch(SQL, body["choices"][0]["message"]["content"]), body
    status, body = post(guided_stack, "/v1/completions",
                        {"prompt": "x", "max_tokens": 8, "structured_outputs": {"grammar": 'root ::= root ")" | "x"'}})
    assert status == 400 and body["error"]["param"] == "structured_outputs.grammar", body
    assert 'rule "root" is left-recursive (root -> root before any text is read)' in body["error"]["message"], body
    with pytest.raises(grpc.RpcError) as err:
        gen("x", max_tokens=4, guided={"grammar": "root ::= undefined"})
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert 'sampling.guided.grammar: grammar at line 1, column 10: rule "undefined" is not defined' in err.value.details()
    grammar = tmp_path / "sql.gbnf"
    grammar.write_text(SQL_GRAMMAR)
    out = subprocess.run([str(binary("ferry-client")), "--target", guided_stack.gateway, "--grammar", str(grammar),
                          "Query:"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and re.fullmatch(SQL, out.stdout.rsplit("\n[", 1)[0]), out


def test_pydantic_string_constraints_validate(gen, guided_stack, tiny_model):
    """A pydantic model's schema with max_length, min_length, pattern, date, date-time, UUID,
    HttpUrl, bounded int and float and tuple fields: every text ends and pydantic itself validates it."""
    pydantic = pytest.importorskip("pydantic")
    import datetime
    import uuid

    class Visit(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=8)
        code: str = pydantic.Field(pattern=r"^[A-Z]{2}-\d{2}$")
        day: datetime.date
        at: datetime.datetime
        id: uuid.UUID
        site: pydantic.HttpUrl
        note: str = pydantic.Field(min_length=2, max_length=12)
        stars: int = pydantic.Field(ge=1, le=5)
        offset: int = pydantic.Field(gt=-10, lt=0)
        score: float = pydantic.Field(ge=0, le=1)
        price: float = pydantic.Field(gt=0)
        where: tuple[pydantic.conint(ge=0, le=99), str]

    schema = json.dumps(Visit.model_json_schema())
    tok = tokenizers.Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    quote = tok.token_to_id('"')
    # '"' favoured so that free strings close soon (they may run to maxLength otherwise), and
    # whitespace-only tokens banned: between twelve fields this model would spend its tokens there.
    spaces = [i for i in range(tok.get_vocab_size()) if tok.decode([i]) and not tok.decode([i]).strip()]
    bias = {quote: 6.0, **{i: -100.0 for i in spaces}}
    for seed in range(4):
        r = gen("Visit:", max_tokens=1000, temperature=1.0, seed=seed, logit_bias=bias,
                guided={"json_schema": schema})
        assert r.finish_reason == EOS, r.text[-400:]
        Visit.model_validate_json(r.text)
    status, body = post(guided_stack, "/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "A visit"}], "max_tokens": 1000, "seed": 9,
                         "temperature": 1.0, "logit_bias": {str(k): v for k, v in bias.items()},
                         "response_format": {"type": "json_schema",
                                             "json_schema": {"name": "visit", "schema": Visit.model_json_schema()}}})
    assert status == 200 and body["choices"][0]["finish_reason"] == "stop", body["choices"][0]["message"]["content"][-500:]
    Visit.model_validate_json(body["choices"][0]["message"]["content"])


# A recursive grammar (nested lists of digits), served by the pushdown automaton.
NESTED_GRAMMAR = """root ::= list
list ::= "[" (item ("," item)*)? "]"
item ::= list | [0-9]
"""


def nested_lists_only(value, depth=0):
    """The parse of a text of NESTED_GRAMMAR: lists of lists and one-digit integers; returns the depth."""
    assert isinstance(value, list), value
    deepest = depth + 1
    for item in value:
        if isinstance(item, list):
            deepest = max(deepest, nested_lists_only(item, depth + 1))
        else:
            assert isinstance(item, int) and 0 <= item <= 9, item
    return deepest


def test_recursive_grammar_texts_are_in_its_language(gen, guided_stack, tiny_model):
    tok = tokenizers.Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    close = tok.token_to_id("]")
    depths = []
    for seed in range(6):
        # ']' favoured so that the lists close within max_tokens (unbiased, this model nests deeper).
        r = gen("Lists:", max_tokens=120, temperature=1.0, seed=seed, logit_bias={close: 4.0},
                guided={"grammar": NESTED_GRAMMAR})
        assert r.finish_reason == EOS, r
        assert re.fullmatch(r"[\[\],0-9]+", r.text), r
        depths.append(nested_lists_only(json.loads(r.text)))
    assert max(depths) >= 2, depths  # some text nested: the recursion was exercised
    status, body = post(guided_stack, "/v1/completions",
                        {"prompt": "Lists:", "max_tokens": 120, "seed": 3, "temperature": 1.0, "n": 2,
                         "logit_bias": {str(close): 4}, "guided_grammar": NESTED_GRAMMAR})
    assert status == 200, body
    for choice in body["choices"]:
        assert choice["finish_reason"] == "stop", body
        nested_lists_only(json.loads(choice["text"]))


def test_bad_guided_values_name_the_field(gen):
    for guided, field in (({"choice": {"choices": []}}, "sampling.guided.choice.choices"),
                          ({"choice": {"choices": ["ok", ""]}}, "sampling.guided.choice.choices[1]"),
                          ({"json_schema": '{"type": "integer", "multipleOf": 2}'}, '"multipleOf" is not supported'),
                          ({"json_schema": "{not json"}, "sampling.guided.json_schema"),
                          ({"regex": "a{3,2}"}, "sampling.guided.regex: regex at byte")):
        with pytest.raises(grpc.RpcError) as err:
            gen("x", max_tokens=4, guided=guided)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in err.value.details(), err.value.details()
    assert gen("x", max_tokens=2).token_ids, "the next request is served"


def test_openai_response_format_and_guided_choice(guided_stack, only_close, close_brace):
    status, body = post(guided_stack, "/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "Answer in JSON"}], "max_tokens": 64,
                         "temperature": 0, "response_format": {"type": "json_object"},
                         "logit_bias": {str(k): v for k, v in only_close.items()}})
    assert status == 200, body
    choice = body["choices"][0]
    assert json.loads(choice["message"]["content"]) == {} and choice["finish_reason"] == "stop"
    status, body = post(guided_stack, "/v1/completions",
                        {"prompt": "Pick a colour", "max_tokens": 32, "temperature": 1.0, "seed": 4, "n": 3,
                         "guided_choice": CHOICES})
    assert status == 200, body
    assert all(c["text"] in CHOICES and c["finish_reason"] == "stop" for c in body["choices"]), body
    status, body = post(guided_stack, "/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "Hi"}],
                         "response_format": {"type": "json_schema", "json_schema": {
                             "name": "x", "schema": {"type": "integer", "multipleOf": 3}}}})
    assert status == 400 and body["error"]["param"] == "response_format", body
    assert "multipleOf" in body["error"]["message"], body
    status, body = post(guided_stack, "/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "Is it raining?"}], "max_tokens": 200,
                         "temperature": 0.7, "seed": 3, "logit_bias": {str(close_brace): 100},
                         "response_format": {"type": "json_schema",
                                             "json_schema": {"name": "verdict", "strict": True, "schema": VERDICT}}})
    assert status == 200, body
    check_verdict(body["choices"][0]["message"]["content"])
    status, body = post(guided_stack, "/v1/completions",
                        {"prompt": "Is it raining?", "max_tokens": 200, "logit_bias": {str(close_brace): 100},
                         "guided_json": VERDICT})
    assert status == 200, body
    check_verdict(body["choices"][0]["text"])


def test_a_backend_without_guided_decoding_refuses_it(tiny_model, tmp_path_factory, ferry_pb):
    preset = REPO / "scheduler" / "sim" / "presets" / "h200.json"
    s = Stack(tiny_model, tmp_path_factory.mktemp("guided-sim-stack"),
              ["--worker-arg=--backend=sim", f"--worker-arg=--cost-model={preset}"])
    try:
        stub = ferry_pb.gen_grpc.GenerationStub(grpc.insecure_channel(s.gateway))
        req = ferry_pb.gen.GenerateRequest(text=b"x", sampling=ferry_pb.gen.SamplingParams(
            max_tokens=4, guided={"json_object": True}))
        with pytest.raises(grpc.RpcError) as err:
            stub.Generate(req, timeout=60)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "guided decoding is not supported" in err.value.details()
        req.sampling.ClearField("guided")
        assert stub.Generate(req, timeout=60).token_ids
    finally:
        assert s.stop() == 0


def test_ferry_client_takes_a_constraint(guided_stack, tmp_path):
    client = [str(binary("ferry-client")), "--target", guided_stack.gateway, "--temperature", "1", "--seed", "2"]
    out = subprocess.run(client + ["--choice", "red", "--choice", "green sky", "Pick a colour"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.rsplit("\n[", 1)[0] in ("red", "green sky"), out.stdout
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"enum": [1, 2, 3]}))
    out = subprocess.run(client + ["--json-schema", str(schema), "Pick a number"], capture_output=True, text=True,
                         timeout=60)
    text = out.stdout.rsplit("\n[", 1)[0]  # the completion, before the client's "[FINISH_REASON_..." line
    assert out.returncode == 0 and json.loads(text) in (1, 2, 3), out
    out = subprocess.run(client + ["--regex", PHONE, "Call me at"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and re.fullmatch(PHONE, out.stdout.rsplit("\n[", 1)[0]), out
    both = subprocess.run(client + ["--json-object", "--choice", "x", "Pick"], capture_output=True, text=True,
                          timeout=60)
    assert both.returncode == 2 and "exclusive" in both.stderr


def test_a_constraint_the_worker_cannot_compile_fails_alone(guided_stack, ferry_pb):
    """A client calling the scheduler directly (the gateway would refuse it first) sends a regex the worker cannot
    compile in one message with two plain requests: the three start in one step, the worker refuses that sequence
    alone (INVALID_ARGUMENT, its reason) and the other two get exactly the tokens they get without it (#54: one
    bad sequence failed its whole step, so the scheduler compiled every constraint to refuse it first)."""
    stub = ferry_pb.sched_grpc.SchedulerStub(grpc.insecure_channel(guided_stack.scheduler))

    def request(prompt, regex=None):
        sampling = ferry_pb.gen.SamplingParams(max_tokens=12, ignore_eos=True, temperature=0.0, top_p=1.0,
                                               repetition_penalty=1.0)
        if regex is not None:
            sampling.guided.regex = regex
        return ferry_pb.sched.SubmitRequest(prompt_token_ids=prompt, sampling=sampling)

    def run(requests):
        message = ferry_pb.sched.SessionRequests(
            submits=[ferry_pb.sched.SessionSubmit(stream_id=i + 1, request=r) for i, r in enumerate(requests)])
        tokens, ends = {}, {}
        for reply in stub.Session(iter([message]), timeout=120):
            for e in reply.events:
                tokens.setdefault(e.stream_id, []).extend(e.token_ids)
                if e.finish != 0 or e.status_code != 0:
                    ends[e.stream_id] = (e.finish, e.status_code, e.status_message)
        return tokens, ends

    good = [request([11, 12, 13, 14]), request([21, 22, 23])]
    alone, _ = run(good)
    tokens, ends = run([good[0], request([31, 32, 33], regex=r"(a)\1"), good[1]])
    assert ends[2][1] == grpc.StatusCode.INVALID_ARGUMENT.value[0], ends
    assert "guided regex: regex at byte 4: backreferences and octal escapes are not supported" in ends[2][2], ends
    assert tokens.get(2, []) == []
    assert (tokens[1], tokens[3]) == (alone[1], alone[2])
    assert len(tokens[1]) == 12 and ends[1][1] == 0 and ends[3][1] == 0, ends
