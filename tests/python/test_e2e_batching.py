"""Batch invariance through the real stack: 32 concurrent greedy requests of
different prompt lengths each return exactly what they return when sent alone."""
import concurrent.futures as cf
import random
import urllib.request

import grpc
from prometheus_client.parser import text_string_to_metric_families

WORDS = ("the quick brown fox jumps over a lazy dog while 北京 的 天气 很好 and numbers 12345 "
         "follow emoji 🚀 with code: def f(x): return x * 2").split()


def make_prompts(n=32, seed=7):
    rng = random.Random(seed)
    # Lengths from a few words to ~150 so that prefills of different sizes share steps.
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 150))) for _ in range(n)]


def generate(stub, pb, prompt, max_tokens=24):
    req = pb.gen.GenerateRequest(text=prompt.encode(), sampling=pb.gen.SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    resp = stub.Generate(req, timeout=120)
    return list(resp.token_ids), resp


def hf_encode(model_dir, text):
    """The prompt's ids by Hugging Face tokenizers reading the model's own tokenizer.json."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(text, add_special_tokens=False).ids


def worker_step_sequences(stack):
    """(sum, count) of the worker's sequences-per-step histogram."""
    url = stack.metrics_urls()["worker-0"]
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    total = count = 0.0
    for family in text_string_to_metric_families(text):
        if family.name == "ferry_worker_step_sequences":
            for s in family.samples:
                if s.name.endswith("_sum"):
                    total = s.value
                elif s.name.endswith("_count"):
                    count = s.value
    return total, count


def test_concurrent_greedy_equals_alone(stack, gen_stub, ferry_pb):
    prompts = make_prompts()
    alone = [generate(gen_stub, ferry_pb, p)[0] for p in prompts]
    for tokens in alone:
        assert len(tokens) == 24
    sum0, count0 = worker_step_sequences(stack)

    with cf.ThreadPoolExecutor(max_workers=32) as pool:
        responses = list(pool.map(lambda p: generate(gen_stub, ferry_pb, p), prompts))
    together = [tokens for tokens, _ in responses]
    # Raw timings, as read (no clamp anywhere): the scheduler's queue time lies inside the wait for the
    # first token, which lies inside the whole request, also when 32 requests queue and batch together.
    for _, resp in responses:
        t = resp.timings
        assert 0 <= t.queue_s <= t.first_token_s <= t.total_s, t

    sum1, count1 = worker_step_sequences(stack)
    # The concurrent run really batched: on average several sequences per step.
    assert count1 > count0
    assert (sum1 - sum0) / (count1 - count0) > 4, "requests were not batched together"
    for i, (a, b) in enumerate(zip(alone, together)):
        assert a == b, f"prompt {i} ({len(prompts[i])} chars): alone {a} != batched {b}"


def test_streaming_equals_unary(gen_stub, ferry_pb):
    prompt = "streaming and unary calls must agree"
    tokens, resp = generate(gen_stub, ferry_pb, prompt, max_tokens=20)
    req = ferry_pb.gen.GenerateRequest(text=prompt.encode(), sampling=ferry_pb.gen.SamplingParams(
        max_tokens=20, temperature=0.0, ignore_eos=True))
    chunks = list(gen_stub.GenerateStream(req, timeout=60))
    streamed = [t for c in chunks for t in c.token_ids]
    assert streamed == tokens
    assert "".join(c.text for c in chunks) == resp.text
    last = chunks[-1]
    assert last.finish_reason == ferry_pb.gen.FINISH_REASON_LENGTH
    assert last.usage.completion_tokens == 20
    assert last.usage.prompt_tokens > 0
    assert 0 <= last.timings.queue_s <= last.timings.first_token_s <= last.timings.total_s


def test_seeded_sampling_reproducible_under_load(gen_stub, ferry_pb):
    def sample(seed):
        req = ferry_pb.gen.GenerateRequest(text=b"sampling with a seed", sampling=ferry_pb.gen.SamplingParams(
            max_tokens=16, temperature=1.0, top_p=0.9, top_k=50, seed=seed, ignore_eos=True))
        return list(gen_stub.Generate(req, timeout=60).token_ids)

    alone = sample(1234)
    with cf.ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(sample, [1234] * 4 + [99, 98, 97, 96]))
    assert all(r == alone for r in results[:4])
    assert any(r != alone for r in results[4:]), "different seeds should give different samples"


def test_token_id_prompt_and_stop_string(gen_stub, ferry_pb, tiny_model):
    tokens, resp = generate(gen_stub, ferry_pb, "stop strings are trimmed", max_tokens=20)
    text = resp.text
    assert len(text) > 4
    stop = text[2:4]
    req = ferry_pb.gen.GenerateRequest(
        text=b"stop strings are trimmed",
        sampling=ferry_pb.gen.SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, stop=[stop.encode()]))
    stopped = gen_stub.Generate(req, timeout=60)
    assert stopped.finish_reason == ferry_pb.gen.FINISH_REASON_STOP
    assert stopped.text == text[: text.find(stop)]

    # The same prompt given as token ids gives the same completion.
    ids_req = ferry_pb.gen.GenerateRequest(
        token_ids=ferry_pb.gen.TokenIds(ids=hf_encode(tiny_model, "stop strings are trimmed")),
        sampling=ferry_pb.gen.SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))
    assert list(gen_stub.Generate(ids_req, timeout=60).token_ids) == tokens


def test_cancelled_stream_frees_the_sequence(stack, gen_stub, ferry_pb):
    req = ferry_pb.gen.GenerateRequest(text=b"cancel me", sampling=ferry_pb.gen.SamplingParams(
        max_tokens=400, temperature=0.0, ignore_eos=True))
    call = gen_stub.GenerateStream(req, timeout=60)
    next(call)
    call.cancel()
    # The next request is served normally and the scheduler ends up idle.
    tokens, _ = generate(gen_stub, ferry_pb, "after a cancel", max_tokens=4)
    assert len(tokens) == 4
    url = stack.metrics_urls()["scheduler"]
    import time
    deadline = time.time() + 10
    while time.time() < deadline:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        values = {(s.name, tuple(sorted(s.labels.items()))): s.value
                  for f in text_string_to_metric_families(text) for s in f.samples}
        used = values[("ferry_scheduler_kv_blocks", (("state", "used"),))]
        running = values[("ferry_scheduler_requests", (("state", "running"),))]
        if used == 0 and running == 0:
            break
        time.sleep(0.1)
    assert used == 0 and running == 0


def test_async_scheduling_changes_no_token(stack, gen_stub, ferry_pb, tiny_model, tmp_path):
    """The default stack (async scheduling: step N+1 planned before step N's tokens are known) and one
    with --no-async-scheduling give the same greedy tokens and finishes, batched, including a stop token
    that the async planner learns of one step late."""
    from conftest import Stack

    sync_stack = Stack(tiny_model, tmp_path, extra_args=["--scheduler-arg=--no-async-scheduling"])
    try:
        assert "async scheduling off" in sync_stack.log_text()
        channel = grpc.insecure_channel(sync_stack.gateway)
        sync_stub = ferry_pb.gen_grpc.GenerationStub(channel)
        prompts = make_prompts(n=16, seed=11)
        full = [generate(gen_stub, ferry_pb, p)[0] for p in prompts]

        def run(stub, i):
            # Stop at the 6th token of the full answer: a stop found after the next step was planned.
            req = ferry_pb.gen.GenerateRequest(text=prompts[i].encode(), sampling=ferry_pb.gen.SamplingParams(
                max_tokens=24, temperature=0.0, ignore_eos=True, stop_token_ids=[full[i][5]]))
            resp = stub.Generate(req, timeout=120)
            return list(resp.token_ids), resp.finish_reason

        with cf.ThreadPoolExecutor(max_workers=32) as pool:
            on = list(pool.map(lambda i: run(gen_stub, i), range(len(prompts))))
            off = list(pool.map(lambda i: run(sync_stub, i), range(len(prompts))))
        for i, (a, b) in enumerate(zip(on, off)):
            assert a == b, f"prompt {i}: async {a} != sync {b}"
            stop_at = full[i].index(full[i][5])  # the first occurrence ends it
            assert a[0] == full[i][:stop_at + 1], f"prompt {i}: {a[0]} is not {full[i]} cut at its stop token"
            assert a[1] == ferry_pb.gen.FINISH_REASON_STOP
        channel.close()
    finally:
        assert sync_stack.stop() == 0
