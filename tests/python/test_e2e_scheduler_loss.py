"""A scheduler's death is a pause (issue #53): the gateway resumes each request it held, on the restarted
scheduler or on another replica, and every client sees exactly the answer of a fault-free run.

64 requests at once, greedy and seeded, of every kind a client sends: gRPC streams (some under way at the
kill, some not yet started), unary gRPC, non-streamed and streamed HTTP completions, jobs and stored
responses. Each runs once without faults (the reference) and once with `kill -9` of the scheduler while
they are in flight:
- under ferry-launch, which restarts the scheduler on its address;
- with two replicas, one of which is killed for good (scheduler and worker): the other takes over.
The gateway's own death is test_e2e_launch_faults.py's: its streams end and nothing runs on behind it."""
import json
import os
import signal
import threading
import time

import grpc
import httpx
import pytest

from conftest import Stack, binary
from faults import Proc, StreamProgress, scrape
from test_launch_supervision import stacks, state, wait_for_new_pids  # noqa: F401

# Long enough that the kill finds the tiny model's requests under way (the whole run takes seconds).
MAX_TOKENS = 384
KINDS = ["stream"] * 18 + ["stream_guided"] * 2 + ["unary"] * 14 + ["unary_logprobs"] * 2 + ["http"] * 10 + ["http_stream"] * 10 + ["job"] * 4 + ["response"] * 4


@pytest.fixture(scope="module")
def pb(ferry_pb):
    from ferry.v1 import jobs_pb2, jobs_pb2_grpc

    ferry_pb.jobs = jobs_pb2
    ferry_pb.jobs_grpc = jobs_pb2_grpc
    return ferry_pb


def mixed_requests(max_tokens):
    """64 requests, kinds interleaved so that each kind has greedy and seeded ones of varied lengths."""
    out = []
    for i in range(len(KINDS)):
        kind = KINDS[(i * 29) % len(KINDS)]  # 29 is prime to 64: a permutation
        seeded = i % 2 == 1
        prompt = f"request {i}: " + " ".join(f"word{(i * 7 + k) % 50}" for k in range(3 + (i * 5) % 40))
        out.append(dict(id=f"r{i}", kind=kind, prompt=prompt, max_tokens=max_tokens - (i % 5) * 4,
                        temperature=0.8 if seeded else 0.0, top_p=0.95 if seeded else 1.0,
                        seed=1000 + i if seeded else 0))
    return out


class Client:
    """Runs one request of any kind; returns (output, finish, error): output is the token ids (gRPC, jobs)
    or the text and completion-token count (HTTP), exactly as the client received them, in order."""

    def __init__(self, pb, grpc_address, http_base, progress):
        self.pb, self.base, self.progress = pb, http_base, progress
        self.channel = grpc.insecure_channel(grpc_address)
        self.gen = pb.gen_grpc.GenerationStub(self.channel)
        self.jobs = pb.jobs_grpc.JobsStub(self.channel)

    def grpc_request(self, r, **extra):
        sampling = self.pb.gen.SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True, temperature=r["temperature"],
                                              top_p=r["top_p"], seed=r["seed"], **extra)
        return self.pb.gen.GenerateRequest(request_id=r["id"], text=r["prompt"].encode(), sampling=sampling,
                                           lane="batch")

    def http_body(self, r):
        return {"model": "m", "prompt": r["prompt"], "max_tokens": r["max_tokens"], "temperature": r["temperature"],
                "top_p": r["top_p"], "seed": r["seed"], "ignore_eos": True, "lane": "batch"}

    def run(self, r):
        try:
            return getattr(self, r["kind"])(r)
        except grpc.RpcError as e:
            return None, None, f"{e.code()}: {e.details()}"
        except (httpx.HTTPError, AssertionError, KeyError) as e:
            return None, None, repr(e)

    def stream(self, r):
        tokens, reason = [], 0
        for chunk in self.gen.GenerateStream(self.grpc_request(r), timeout=300):
            tokens += chunk.token_ids
            if chunk.token_ids:
                self.progress.add(r["id"], len(chunk.token_ids))
            reason = chunk.finish_reason or reason
        return tokens, reason, None

    def unary(self, r):
        response = self.gen.Generate(self.grpc_request(r), timeout=300)
        return list(response.token_ids), response.finish_reason, None

    def stream_guided(self, r):
        """A regex the worker's matcher follows token by token: a resume rebuilds its state from the tokens given.
        The end-of-sequence token may end it once 24 characters are out."""
        request = self.grpc_request(r)
        request.sampling.ignore_eos = False
        request.sampling.guided.regex = "[a-z0-9 ]{24,}"
        tokens, reason, text = [], 0, ""
        for chunk in self.gen.GenerateStream(request, timeout=300):
            tokens += chunk.token_ids
            text += chunk.text
            if chunk.token_ids:
                self.progress.add(r["id"], len(chunk.token_ids))
            reason = chunk.finish_reason or reason
        assert all(c in "abcdefghijklmnopqrstuvwxyz0123456789 " for c in text), text
        return (tokens, text), reason, None

    def unary_logprobs(self, r):
        """Logprobs of each token and of the prompt: a resume sends the prompt's again, the gateway passes each
        once."""
        response = self.gen.Generate(self.grpc_request(r, logprobs=2, prompt_logprobs=1), timeout=300)
        def entries(lps):
            return [(lp.token_id, lp.logprob, [(t.token_id, t.logprob) for t in lp.top]) for lp in lps]
        return (list(response.token_ids), entries(response.logprobs), entries(response.prompt_logprobs)), \
            response.finish_reason, None

    def http(self, r):
        resp = httpx.post(self.base + "/v1/completions", json=self.http_body(r), timeout=300)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        return (body["choices"][0]["text"], body["usage"]["completion_tokens"]), body["choices"][0]["finish_reason"], None

    def http_stream(self, r):
        body = {**self.http_body(r), "stream": True, "stream_options": {"include_usage": True}}
        text, reason, usage, done = "", None, None, False
        with httpx.stream("POST", self.base + "/v1/completions", json=body, timeout=300) as resp:
            assert resp.status_code == 200, resp.read()
            for line in resp.iter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                event = json.loads(line[6:])
                assert "error" not in event, event
                for choice in event.get("choices", []):
                    text += choice.get("text", "")
                    reason = choice.get("finish_reason") or reason
                usage = event.get("usage") or usage
        assert done and usage is not None, (done, usage)
        return (text, usage["completion_tokens"]), reason, None

    def job(self, r):
        job_id = self.jobs.Submit(self.grpc_request(r), timeout=30).job_id
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            job = self.jobs.GetJob(self.pb.jobs.GetJobRequest(job_id=job_id), timeout=30)
            if job.state == self.pb.jobs.JOB_STATE_DONE:
                return list(job.result.token_ids), job.result.finish_reason, None
            if job.state in (self.pb.jobs.JOB_STATE_FAILED, self.pb.jobs.JOB_STATE_CANCELLED):
                return None, None, f"job {job.state}: {job.error_message}"
            time.sleep(0.05)
        return None, None, "job unfinished"

    def response(self, r):
        body = {"model": "m", "input": r["prompt"], "max_output_tokens": r["max_tokens"],
                "temperature": r["temperature"], "top_p": r["top_p"], "seed": r["seed"], "store": True}
        created = httpx.post(self.base + "/v1/responses", json=body, timeout=300)
        assert created.status_code == 200, created.text
        stored = httpx.get(self.base + "/v1/responses/" + created.json()["id"], timeout=30)
        assert stored.status_code == 200, stored.text
        out = stored.json()
        assert out == created.json()
        text = "".join(c["text"] for item in out["output"] for c in item.get("content", []))
        return (text, out["usage"]["output_tokens"]), out["status"], None


def run_all(client, requests):
    results, lock = {}, threading.Lock()

    def one(r):
        result = client.run(r)
        with lock:
            results[r["id"]] = result

    threads = [threading.Thread(target=one, args=(r,)) for r in requests]
    for t in threads:
        t.start()
    for t in threads:
        t.join(360)
    assert len(results) == len(requests), "some requests never ended"
    return results


def assert_same_answers(got, expected, requests):
    kinds = {r["id"]: r["kind"] for r in requests}
    for rid, want in expected.items():
        assert want[2] is None, (rid, kinds[rid], want)
        assert got[rid] == want, (rid, kinds[rid], got[rid][2])


def kill_when_under_way(progress, total, kill, stream_ids):
    """Waits for a quarter of the streams' tokens, then kills; returns the kill's monotonic interval and the
    streams that had tokens at that moment."""
    progress.wait_for(total // 4, timeout_s=120)
    with progress.lock:
        under_way = {rid for rid, times in progress.arrivals.items() if times}
    before = time.monotonic()
    kill()
    return (before, time.monotonic()), under_way


def stream_tokens(expected, requests):
    return sum(len(expected[r["id"]][0]) for r in requests if r["kind"] == "stream")


def check_the_kill_landed(progress, killed_at, under_way, requests):
    streams = {r["id"] for r in requests if r["kind"] == "stream"}
    assert under_way & streams and streams - under_way, "the kill should find streams started and not yet started"
    with progress.lock:
        seen = {rid: (round(t[0] - killed_at[0], 3), round(t[-1] - killed_at[1], 3), len(t))
                for rid, t in progress.arrivals.items()}
    assert progress.straddling(*killed_at), f"no stream had tokens delivered on both sides of the kill: {seen}"


def test_a_killed_scheduler_restarts_and_every_request_ends_as_without_faults(tiny_model, tmp_path, pb, stacks):
    s = Stack(tiny_model, tmp_path, ["--http-port", "0", "--served-model-name", "m",
                                     "--scheduler-arg=--max-num-seqs=16"])
    stacks.append(s)
    requests = mixed_requests(max_tokens=MAX_TOKENS)
    expected = run_all(Client(pb, s.gateway, s.http, StreamProgress()), requests)
    progress = StreamProgress()
    client = Client(pb, s.gateway, s.http, progress)
    before = state(s)["scheduler"]
    kill = {}
    injector = threading.Thread(target=lambda: kill.update(zip(("at", "under_way"), kill_when_under_way(
        progress, stream_tokens(expected, requests), lambda: os.kill(before["pid"], signal.SIGKILL), None))))
    injector.start()
    got = run_all(client, requests)
    injector.join(150)
    assert kill, "the kill did not happen"
    assert_same_answers(got, expected, requests)
    check_the_kill_landed(progress, kill["at"], kill["under_way"], requests)
    [after] = wait_for_new_pids(s, "scheduler", {before["pid"]})
    assert after["restarts"] == 1
    m = scrape(state(s)["gateway"]["metrics_port"])
    assert m['ferry_gateway_migrations_total{outcome="resumed"}'] >= len(kill["under_way"]) > 0
    assert m['ferry_gateway_migrations_total{outcome="limit"}'] == 0


@pytest.fixture()
def two_replicas(tiny_model, tmp_path):
    log = open(tmp_path / "services.log", "wb")
    procs = []
    try:
        schedulers = []
        for i in range(2):
            w = Proc(f"worker-{i}", [binary("ferry-worker"), "--model", str(tiny_model), "--port", "0"], tmp_path, log)
            procs.append(w)
            sch = Proc(f"scheduler-{i}", [binary("ferry-scheduler"), "--port", "0", "--worker", w.address,
                                          "--max-num-seqs", "16"], tmp_path, log)
            procs.append(sch)
            schedulers.append((sch, w))
        g = Proc("gateway", [binary("ferry-gateway"), "--tokenizer", str(tiny_model), "--port", "0", "--http-port", "0",
                             "--served-model-name", "m",
                             *[a for sch, _ in schedulers for a in ("--scheduler", sch.address)]], tmp_path, log)
        procs.append(g)
        yield g, schedulers
    finally:
        for p in reversed(procs):
            p.stop()
        log.close()


def test_one_of_two_replicas_killed_for_good_and_the_other_ends_every_request_as_without_faults(two_replicas, pb):
    gateway, schedulers = two_replicas
    http = f"http://127.0.0.1:{gateway.http_port}"
    requests = mixed_requests(max_tokens=MAX_TOKENS)
    expected = run_all(Client(pb, gateway.address, http, StreamProgress()), requests)
    progress = StreamProgress()
    client = Client(pb, gateway.address, http, progress)
    doomed_scheduler, doomed_worker = schedulers[1]

    def kill_the_replica():
        assert scrape(doomed_scheduler.metrics_port)['ferry_scheduler_requests{state="running"}'] > 0
        doomed_scheduler.kill(signal.SIGKILL)
        doomed_worker.kill(signal.SIGKILL)

    kill = {}
    injector = threading.Thread(target=lambda: kill.update(zip(("at", "under_way"), kill_when_under_way(
        progress, stream_tokens(expected, requests), kill_the_replica, None))))
    injector.start()
    got = run_all(client, requests)
    injector.join(150)
    assert kill, "the kill did not happen"
    assert_same_answers(got, expected, requests)
    check_the_kill_landed(progress, kill["at"], kill["under_way"], requests)
    m = scrape(gateway.metrics_port)
    assert m['ferry_gateway_migrations_total{outcome="resumed"}'] > 0
    assert m['ferry_gateway_migrations_total{outcome="limit"}'] == 0
