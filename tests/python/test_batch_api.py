"""OpenAI's Batch API (issue #58) end to end, through the official `openai` client against a stack
started by ferry-launch whose gateway keeps its files and batches in SQLite (--state-dir): upload,
create, poll to completed, download; each answer equals the same request sent directly (greedy); a
line with a bad body or no JSON lands in the error file with its custom_id; the refusals of bad
input name the field and the limit. Two tenants (a keys file) see none of each other's files."""
import hashlib
import json
import secrets
import time

import openai
import pytest

from conftest import Stack, serve

KEYS = {tenant: "fk-" + secrets.token_hex(16) for tenant in ("acme", "shop")}
MAX_FILE_BYTES = 64 << 10
MAX_STORE_BYTES = 256 << 10


@pytest.fixture(scope="module")
def batch_stack(tiny_model, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("batch-stack")
    keys_file = run_dir / "keys.yaml"
    keys_file.write_text("tenants:\n  - name: acme\n  - name: shop\nkeys:\n" + "".join(
        f"  - {{sha256: {hashlib.sha256(key.encode()).hexdigest()}, tenant: {tenant}}}\n"
        for tenant, key in KEYS.items()))
    yield from serve(Stack(tiny_model, run_dir, [
        "--http-port", "0", "--served-model-name", "m", f"--gateway-arg=--api-keys-file={keys_file}",
        f"--gateway-arg=--state-dir={run_dir / 'state'}", f"--gateway-arg=--max-file-bytes={MAX_FILE_BYTES}",
        f"--gateway-arg=--max-store-bytes={MAX_STORE_BYTES}"]))


def client_of(stack, tenant):
    return openai.OpenAI(base_url=stack.http + "/v1", api_key=KEYS[tenant], max_retries=0)


@pytest.fixture(scope="module")
def client(batch_stack):
    return client_of(batch_stack, "acme")


def jsonl(lines):
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines).encode()


def wait_final(client, batch_id, timeout_s=180):
    deadline = time.time() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        assert time.time() < deadline, batch
        time.sleep(0.2)


def by_custom_id(client, file_id):
    out = {}
    for text in client.files.content(file_id).text.splitlines():
        line = json.loads(text)
        assert line["custom_id"] not in out, text
        out[line["custom_id"]] = line
    return out


def chat_body(i):
    return {"model": "m", "messages": [{"role": "user", "content": f"Tell me story number {i}."}],
            "max_tokens": 12, "temperature": 0}


def test_chat_batch_answers_equal_direct_requests_and_bad_lines_go_to_the_error_file(client):
    lines = [{"custom_id": f"story-{i}", "method": "POST", "url": "/v1/chat/completions", "body": chat_body(i)}
             for i in range(16)]
    lines.insert(5, {"custom_id": "bad-body", "method": "POST", "url": "/v1/chat/completions",
                     "body": {**chat_body(99), "max_tokens": -3}})
    lines.insert(9, "{this line is not json")
    uploaded = client.files.create(file=("input.jsonl", jsonl(lines)), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == len(jsonl(lines))
    assert client.files.retrieve(uploaded.id).filename == "input.jsonl"
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"job": "stories"})
    assert batch.status == "in_progress" and batch.metadata == {"job": "stories"}
    assert batch.request_counts.total == 18
    done = wait_final(client, batch.id)
    assert done.status == "completed", done
    assert (done.request_counts.completed, done.request_counts.failed) == (16, 2), done.request_counts
    output = by_custom_id(client, done.output_file_id)
    assert sorted(output) == sorted(f"story-{i}" for i in range(16))
    for i in range(16):
        line = output[f"story-{i}"]
        assert line["error"] is None and line["response"]["status_code"] == 200, line
        direct = client.chat.completions.create(**chat_body(i))
        assert line["response"]["body"]["choices"][0]["message"]["content"] == direct.choices[0].message.content
        assert line["response"]["body"]["usage"]["completion_tokens"] == direct.usage.completion_tokens
    errors = by_custom_id(client, done.error_file_id)
    bad = errors["bad-body"]
    assert bad["response"]["status_code"] == 400, bad
    assert "max_tokens" in bad["error"]["message"], bad
    unparsed = errors[None]
    assert unparsed["error"]["message"].startswith("line 10: "), unparsed
    # The output files are the tenant's, listed with purpose batch_output.
    outputs = client.files.list(purpose="batch_output")
    assert {done.output_file_id, done.error_file_id} <= {f.id for f in outputs.data}
    assert any(b.id == batch.id for b in client.batches.list(limit=5).data)


def test_completions_and_responses_batches_answer_as_their_endpoints(client):
    prompts = ["Once upon a time", "The quick brown fox", "In a galaxy far away"]
    lines = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": "m", "prompt": p, "max_tokens": 10, "temperature": 0}} for i, p in enumerate(prompts)]
    f = client.files.create(file=("completions.jsonl", jsonl(lines)), purpose="batch")
    done = wait_final(client, client.batches.create(input_file_id=f.id, endpoint="/v1/completions",
                                                    completion_window="1h").id)
    assert done.status == "completed" and done.request_counts.completed == 3, done
    output = by_custom_id(client, done.output_file_id)
    for i, p in enumerate(prompts):
        direct = client.completions.create(model="m", prompt=p, max_tokens=10, temperature=0)
        assert output[f"c{i}"]["response"]["body"]["choices"][0]["text"] == direct.choices[0].text

    lines = [{"custom_id": "r0", "method": "POST", "url": "/v1/responses",
              "body": {"model": "m", "input": "Say something.", "max_output_tokens": 10, "temperature": 0}}]
    f = client.files.create(file=("responses.jsonl", jsonl(lines)), purpose="batch")
    done = wait_final(client, client.batches.create(input_file_id=f.id, endpoint="/v1/responses",
                                                    completion_window="24h").id)
    assert done.status == "completed", done
    body = by_custom_id(client, done.output_file_id)["r0"]["response"]["body"]
    direct = client.responses.create(model="m", input="Say something.", max_output_tokens=10, temperature=0)
    assert body["object"] == "response" and body["output"][0]["content"][0]["text"] == direct.output_text


def test_bad_input_names_the_field_and_the_limit(client, batch_stack):
    f = client.files.create(file=("in.jsonl", jsonl([{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                                                      "body": chat_body(0)}])), purpose="batch")
    with pytest.raises(openai.BadRequestError) as e:
        client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h")
    assert e.value.body["param"] == "endpoint" and "/v1/chat/completions" in e.value.body["message"], e.value.body
    with pytest.raises(openai.BadRequestError) as e:
        client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="9d")
    assert e.value.body["param"] == "completion_window", e.value.body
    with pytest.raises(openai.APIStatusError) as e:
        client.files.create(file=("big.jsonl", b"x" * (MAX_FILE_BYTES + 1)), purpose="batch")
    assert e.value.status_code == 413 and str(MAX_FILE_BYTES) in e.value.body["message"], e.value.body
    with pytest.raises(openai.BadRequestError) as e:
        client.files.create(file=("in.jsonl", b"{}\n"), purpose="fine-tune")
    assert e.value.body["param"] == "purpose", e.value.body

    # Another tenant's file and batch answer as unknown ones, and it cannot run a batch on the file.
    other = client_of(batch_stack, "shop")
    with pytest.raises(openai.NotFoundError):
        other.files.retrieve(f.id)
    with pytest.raises(openai.NotFoundError):
        other.files.content(f.id)
    with pytest.raises(openai.NotFoundError) as e:
        other.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert e.value.body["param"] == "input_file_id", e.value.body
    assert f.id not in {x.id for x in other.files.list().data}

    # A full store: the upload past --max-store-bytes is refused naming the limit, and is not listed.
    chunk = b"y" * (MAX_FILE_BYTES - 1)
    before = {x.id for x in other.files.list().data}
    refused = None
    for _ in range(MAX_STORE_BYTES // len(chunk) + 2):
        try:
            other.files.create(file=("fill.jsonl", chunk), purpose="batch")
        except openai.APIStatusError as error:
            refused = error
            break
    assert refused is not None and refused.status_code == 507, refused
    assert str(MAX_STORE_BYTES) in refused.body["message"], refused.body
    listed = other.files.list().data
    assert all(x.bytes == len(chunk) for x in listed if x.id not in before)
    for x in listed:
        assert other.files.delete(x.id).deleted
    assert other.files.list().data == []


def test_cancel_ends_a_batch_with_what_it_finished(client):
    lines = [{"custom_id": f"long-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {**chat_body(i), "max_tokens": 64}} for i in range(200)]
    f = client.files.create(file=("long.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled"), cancelling
    done = wait_final(client, batch.id)
    assert done.status == "cancelled", done
    assert done.request_counts.completed < 200, done.request_counts
    if done.output_file_id:
        assert len(by_custom_id(client, done.output_file_id)) == done.request_counts.completed


def test_store_metrics_are_exported_as_catalogued(client, batch_stack):
    """The `--state-dir` rows of docs/metrics.md: exported with exactly their labels, and they count
    what the tests above stored (read every 5 s)."""
    from observability import rows_for, sample_label_names, scrape
    url = batch_stack.metrics_urls()["gateway"]
    deadline = time.time() + 15
    while True:
        families = scrape(url)
        done = families["ferry_gateway_store_batches"].samples
        if any(s.labels["status"] == "completed" and s.value > 0 for s in done) or time.time() > deadline:
            break
        time.sleep(0.5)
    rows = [r for r in rows_for("gateway") if r.exported == "--state-dir"]
    assert len(rows) == 10
    for row in rows:
        assert row.family in families, row.name
        assert families[row.family].type == row.type, row.name
        assert sample_label_names(families[row.family]) == {row.labels}, row.name
    assert families["ferry_gateway_store_files"].samples[0].value >= 3
    assert families["ferry_gateway_store_file_bytes"].samples[0].value > 0
    completed = {s.labels["outcome"]: s.value for s in families["ferry_gateway_batch_lines"].samples
                 if s.name.endswith("_total")}
    assert completed["completed"] >= 16 + 3 + 1 and completed["failed"] >= 1, completed
