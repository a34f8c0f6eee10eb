"""The Responses API (/v1/responses) with the official openai client, against the tiny model.

It runs on the chat path: the same prompt and seed give the same text as /v1/chat/completions.
"""
import json

import httpx
import pytest

from conftest import Stack, serve

openai = pytest.importorskip("openai")

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           # Bounded, so that the random model's call closes within max_output_tokens (JSON whitespace runs are at
           # most 32 bytes: a few gaps of those and 8 characters).
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                          "required": ["city"], "additionalProperties": False}}


@pytest.fixture(scope="module")
def stack(tiny_model, tmp_path_factory):
    yield from serve(Stack(tiny_model, tmp_path_factory.mktemp("responses-stack"),
                           ["--http-port", "0", "--served-model-name", "m"]))


@pytest.fixture(scope="module")
def client(stack):
    return openai.OpenAI(base_url=stack.http + "/v1", api_key="unused", max_retries=0)


def test_create_matches_chat_and_is_stored(client):
    r = client.responses.create(model="m", instructions="Be brief.", input="Tell me a story.", max_output_tokens=12,
                                temperature=0, extra_body={"seed": 3})
    chat = client.chat.completions.create(model="m", max_tokens=12, temperature=0, seed=3,
                                          messages=[{"role": "system", "content": "Be brief."},
                                                    {"role": "user", "content": "Tell me a story."}])
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "m"
    assert r.output_text == chat.choices[0].message.content
    assert r.output[0].type == "message" and r.output[0].role == "assistant"
    assert r.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert r.instructions == "Be brief." and r.max_output_tokens == 12 and r.temperature == 0
    again = client.responses.retrieve(r.id)
    assert again.model_dump() == r.model_dump()
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_stream_events_in_openai_order(client):
    events = list(client.responses.create(model="m", input="Tell me a story.", max_output_tokens=8, temperature=0,
                                          stream=True))
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    final = events[-1].response
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete" if final.status == "incomplete" else "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert final.output_text == deltas == events[-4].text
    assert 0 < final.usage.output_tokens <= 8
    whole = client.responses.create(model="m", input="Tell me a story.", max_output_tokens=8, temperature=0)
    assert whole.output_text == deltas
    # A streamed response is stored as well, as it ended.
    assert client.responses.retrieve(final.id).output_text == deltas
    # The SDK's own stream helper accumulates the events (it checks their items and indexes). Its
    # final response comes only with response.completed, as from OpenAI; this one may be incomplete.
    # How many tokens one delta carries depends on timing (tokens that reach the gateway together go out
    # together; under ASan two streams split differently), so runs of deltas compare as one.
    with client.responses.stream(model="m", input="Tell me a story.", max_output_tokens=8, temperature=0) as s:
        helper_events = list(s)
    assert _without_repeated_deltas([e.type for e in helper_events]) == _without_repeated_deltas(types)
    assert "".join(e.delta for e in helper_events if e.type == "response.output_text.delta") == deltas


def _without_repeated_deltas(types):
    return [t for i, t in enumerate(types) if not (t == "response.output_text.delta" and i > 0 and types[i - 1] == t)]


def test_tool_call_round_trip_with_previous_response_id(client):
    called = client.responses.create(model="m", input="Weather in Oslo?", tools=[WEATHER], max_output_tokens=200,
                                     tool_choice={"type": "function", "name": "get_weather"}, temperature=0)
    calls = [o for o in called.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert isinstance(json.loads(calls[0].arguments)["city"], str)  # generated under the parameters' schema
    answer = client.responses.create(
        model="m", previous_response_id=called.id, tools=[WEATHER], max_output_tokens=6, temperature=0,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 18C"}])
    assert answer.previous_response_id == called.id
    assert answer.output[0].type == "message"
    # The continuation's prompt holds the first turn, the call and its output.
    assert answer.usage.input_tokens > called.usage.input_tokens + 5
    # The same, streamed: the call is a function_call item with argument deltas.
    events = list(client.responses.create(model="m", input="Weather in Oslo?", tools=[WEATHER], stream=True,
                                          tool_choice={"type": "function", "name": "get_weather"},
                                          max_output_tokens=200, temperature=0))
    added = [e for e in events if e.type == "response.output_item.added"]
    assert added[0].item.type == "function_call" and added[0].item.name == "get_weather"
    done = [e for e in events if e.type == "response.function_call_arguments.done"][0]
    assert done.arguments == "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert done.arguments == calls[0].arguments  # greedy: the same call as unstreamed
    with client.responses.stream(model="m", input="Weather in Oslo?", tools=[WEATHER], max_output_tokens=200,
                                 tool_choice={"type": "function", "name": "get_weather"}, temperature=0) as s:
        for _ in s:
            pass
        streamed = s.get_final_response().output
    assert [(o.type, o.name, o.arguments) for o in streamed] == [("function_call", "get_weather", calls[0].arguments)]


def test_structured_output_through_text_format(client):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 150}},
              "required": ["name", "age"], "additionalProperties": False}
    r = client.responses.create(model="m", input="A person, as JSON.", max_output_tokens=200, temperature=0,
                                text={"format": {"type": "json_schema", "name": "person", "schema": schema,
                                                 "strict": True}})
    value = json.loads(r.output_text)
    assert set(value) == {"name", "age"} and isinstance(value["age"], int)
    assert r.text.format.type == "json_schema"


def test_previous_response_id_continues_and_store_false_is_not_kept(client):
    first = client.responses.create(model="m", input="My name is Ada.", max_output_tokens=4, temperature=0)
    second = client.responses.create(model="m", previous_response_id=first.id, input="What is my name?",
                                     max_output_tokens=4, temperature=0)
    alone = client.responses.create(model="m", input="What is my name?", max_output_tokens=4, temperature=0)
    assert second.usage.input_tokens > alone.usage.input_tokens  # the first turn is in its prompt
    unstored = client.responses.create(model="m", input="Hi", max_output_tokens=2, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="m", previous_response_id=unstored.id, input="Hi", max_output_tokens=2)
    assert e.value.body["param"] == "previous_response_id"


def test_refusals_name_the_field(stack, client):
    for body, param in [({"input": "Hi", "reasoning": {"effort": "high"}}, "reasoning"),
                        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
                        ({"input": "Hi", "max_output_tokens": 0}, "max_output_tokens"),
                        ({"input": "Hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
                        ({"input": "Hi", "no_such_field": 1}, "no_such_field"),
                        ({}, "input")]:
        r = httpx.post(stack.http + "/v1/responses", json={"model": "m", **body}, timeout=30)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["param"] == param, (body, r.text)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="other", input="Hi")
    assert e.value.body["code"] == "model_not_found"
    # The next request is served.
    assert client.responses.create(model="m", input="Hi", max_output_tokens=2).status in ("completed", "incomplete")
