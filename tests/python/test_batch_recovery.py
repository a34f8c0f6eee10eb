"""Batches, jobs and stored responses survive their gateway (issue #58): the gateway killed with
SIGKILL in the middle of a 200-line batch and of 50 jobs (ferry.v1.Jobs), and restarted by
ferry-launch, finishes both, every line in the output once and every job done once; a stored
response is read back and continued (previous_response_id) after the restart. Two gateways on one
PostgreSQL (a server started here from Debian's postgresql package, on loopback), one of them killed
mid batch and mid jobs: the other finishes its lines and jobs once their leases run out.

Counted at the scheduler, every line and job runs to its end once: one cut off by the kill ends
there as `cancelled` and runs again; one the scheduler finished whose answer the gateway had not yet
recorded is sent again under the same Idempotency-Key (the line id; the job's key, or one derived
from its id) and answered from the scheduler's record without running
(ferry_scheduler_requests_replayed_total)."""
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import grpc
import openai
import pytest

from conftest import REPO, Stack, binary
from observability import scrape

LINES = 200
CONCURRENCY = 16
LEASE_S = 2
JOBS = 50
JOB_TOKENS = 32
JOB_WORKERS = 2  # the jobs outlast the first fifth of the batch, so the kill finds some running
DIRECT = 3  # requests each check sends directly, to compare (greedy)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chat_line(i):
    return {"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": f"Write line {i} of a poem."}],
                     "max_tokens": 24, "temperature": 0}}


def create_batch(client):
    data = "".join(json.dumps(chat_line(i)) + "\n" for i in range(LINES)).encode()
    f = client.files.create(file=("poem.jsonl", data), purpose="batch")
    return client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")


def while_restarting(call, *args):
    """call(*args), retried while the gateway is down (it is being restarted)."""
    deadline = time.time() + 60
    while True:
        try:
            return call(*args)
        except (openai.APIConnectionError, openai.InternalServerError):
            assert time.time() < deadline, "the gateway did not come back"
            time.sleep(0.2)


def retrieve(client, batch_id):
    return while_restarting(client.batches.retrieve, batch_id)


def wait_completed_at_least(client, batch_id, n, timeout_s=240):
    deadline = time.time() + timeout_s
    while True:
        batch = retrieve(client, batch_id)
        final = batch.status in ("completed", "failed", "expired", "cancelled")
        if final or (n < LINES and batch.request_counts.completed >= n):  # n = LINES: wait for the final status
            return batch
        assert time.time() < deadline, batch
        time.sleep(0.1)


def finished_by_reason(metrics_url):
    families = scrape(metrics_url)
    out = {s.labels["reason"]: s.value for s in families["ferry_scheduler_requests_finished"].samples
           if s.name.endswith("_total")}
    out["replayed"] = next(s.value for s in families["ferry_scheduler_requests_replayed"].samples
                           if s.name.endswith("_total"))
    return out


def check_ran_once(before, after, expected, what):
    """The requests sent (lines, jobs and the direct checks) that ran to their end at the
    scheduler: each once."""
    ran = sum(after.get(r, 0) - before.get(r, 0) for r in ("length", "eos", "stop_token"))
    cut = after.get("cancelled", 0) - before.get("cancelled", 0)
    replayed = after["replayed"] - before["replayed"]
    print(f"{what}: {ran:.0f} ran to their end at the scheduler, {cut:.0f} cut off by the kill "
          f"(run again), {replayed:.0f} answered from the record")
    assert ran == expected, (ran, expected, cut, replayed)


@pytest.fixture(scope="module")
def pb(ferry_pb):
    from ferry.v1 import jobs_pb2, jobs_pb2_grpc

    ferry_pb.jobs = jobs_pb2
    ferry_pb.jobs_grpc = jobs_pb2_grpc
    return ferry_pb


def job_request(pb, i):
    return pb.gen.GenerateRequest(text=f"Job {i} tells a story:".encode(), lane="batch", sampling=pb.gen.SamplingParams(
        max_tokens=JOB_TOKENS, temperature=0.0, ignore_eos=True))


def submit_jobs(pb, address):
    with grpc.insecure_channel(address) as channel:
        stub = pb.jobs_grpc.JobsStub(channel)
        return [stub.Submit(job_request(pb, i), timeout=30).job_id for i in range(JOBS)]


def unfinished_jobs(pb, address, ids):
    with grpc.insecure_channel(address) as channel:
        stub = pb.jobs_grpc.JobsStub(channel)
        states = [stub.GetJob(pb.jobs.GetJobRequest(job_id=i), timeout=30).state for i in ids]
    return sum(s in (pb.jobs.JOB_STATE_QUEUED, pb.jobs.JOB_STATE_RUNNING) for s in states)


def wait_jobs(pb, address, ids, timeout_s=240):
    """{id: Job} once every job has finished, retrying while the gateway is down (restarting)."""
    final = (pb.jobs.JOB_STATE_DONE, pb.jobs.JOB_STATE_FAILED, pb.jobs.JOB_STATE_CANCELLED)
    finished = {}
    deadline = time.time() + timeout_s
    with grpc.insecure_channel(address) as channel:
        stub = pb.jobs_grpc.JobsStub(channel)
        while len(finished) < len(ids):
            assert time.time() < deadline, f"{len(ids) - len(finished)} jobs unfinished"
            for job_id in ids:
                if job_id in finished:
                    continue
                try:
                    job = stub.GetJob(pb.jobs.GetJobRequest(job_id=job_id), timeout=10)
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.UNAVAILABLE, e
                    time.sleep(0.2)
                    break
                if job.state in final:
                    finished[job_id] = job
            time.sleep(0.05)
    return finished


def check_jobs(pb, address, ids, finished):
    """Every job done, its result that of the same request sent directly (greedy)."""
    assert all(finished[i].state == pb.jobs.JOB_STATE_DONE for i in ids), \
        [finished[i] for i in ids if finished[i].state != pb.jobs.JOB_STATE_DONE][:2]
    with grpc.insecure_channel(address) as channel:
        gen = pb.gen_grpc.GenerationStub(channel)
        for k in (0, JOBS // 2, JOBS - 1):
            direct = gen.Generate(job_request(pb, k), timeout=60)
            assert list(finished[ids[k]].result.token_ids) == list(direct.token_ids), k
            assert finished[ids[k]].result.usage.completion_tokens == JOB_TOKENS


def check_output(client, batch):
    assert batch.status == "completed", batch
    assert (batch.request_counts.completed, batch.request_counts.failed) == (LINES, 0), batch.request_counts
    lines = [json.loads(t) for t in client.files.content(batch.output_file_id).text.splitlines()]
    assert sorted(line["custom_id"] for line in lines) == sorted(f"line-{i}" for i in range(LINES))
    by_id = {line["custom_id"]: line for line in lines}
    # Greedy: a line run again after the kill answers as the same request sent directly.
    for i in (0, LINES // 2, LINES - 1):
        direct = client.chat.completions.create(**chat_line(i)["body"])
        assert by_id[f"line-{i}"]["response"]["body"]["choices"][0]["message"]["content"] == \
            direct.choices[0].message.content


def test_a_gateway_killed_mid_batch_and_jobs_and_restarted_finishes_every_one_once(tiny_model, tmp_path, pb):
    stack = Stack(tiny_model, tmp_path, ["--http-port", "0", "--served-model-name", "m",
                                         f"--gateway-arg=--batch-lease-s={LEASE_S}",
                                         f"--gateway-arg=--batch-concurrency={CONCURRENCY}",
                                         f"--gateway-arg=--job-lease-s={LEASE_S}",
                                         f"--gateway-arg=--job-workers={JOB_WORKERS}"])
    try:
        client = openai.OpenAI(base_url=stack.http + "/v1", api_key="unused", max_retries=0)
        scheduler_metrics = stack.metrics_urls()["scheduler"]
        before = finished_by_reason(scheduler_metrics)
        # A stored response, and what continuing it gives before the restart (2 runs).
        first = client.responses.create(model="m", input="Tell me about rivers.", max_output_tokens=8, temperature=0)
        follow = dict(model="m", input="And lakes?", previous_response_id=first.id, max_output_tokens=8,
                      temperature=0, store=False)
        follow_before = client.responses.create(**follow).output_text
        job_ids = submit_jobs(pb, stack.gateway)
        batch = create_batch(client)
        midway = wait_completed_at_least(client, batch.id, LINES // 5)
        assert midway.status == "in_progress", midway
        running = unfinished_jobs(pb, stack.gateway, job_ids)
        assert running > 0, "every job finished before the kill: the test would show nothing"
        out = subprocess.run(["bash", str(REPO / "scripts" / "chaos.sh"), str(stack.ready_file), "kill-gateway"],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        print(f"killed with {running} of {JOBS} jobs unfinished")
        done = wait_completed_at_least(client, batch.id, LINES)
        check_output(client, batch=done)
        check_jobs(pb, stack.gateway, job_ids, wait_jobs(pb, stack.gateway, job_ids))
        # The stored response came through the restart whole: read back, and continued alike.
        assert while_restarting(client.responses.retrieve, first.id).output_text == first.output_text
        assert client.responses.create(**follow).output_text == follow_before
        check_ran_once(before, finished_by_reason(scheduler_metrics), LINES + DIRECT + JOBS + DIRECT + 3,
                       f"{LINES} lines, {JOBS} jobs, {2 * DIRECT} direct checks, 3 responses")
    finally:
        code = stack.stop()
    assert code == 0, stack.log_text()


def postgres_bindir():
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: float(p.parent.parent.name))
    if not versions:
        pytest.fail("PostgreSQL server binaries are missing (/usr/lib/postgresql/*/bin): scripts/setup.sh installs "
                    "Debian's postgresql")
    return versions[-1].parent


@pytest.fixture()
def postgres():
    """A PostgreSQL server of its own on a loopback port; its URL."""
    bindir = postgres_bindir()
    # Under /tmp itself: as root the server runs as `postgres`, who cannot enter pytest's (0700) tmp dirs.
    root = Path(tempfile.mkdtemp(prefix="ferry-pg-"))
    as_postgres = []
    if os.geteuid() == 0:  # the server refuses to run as root
        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
        as_postgres = ["/usr/sbin/runuser", "-u", "postgres", "--"]
    subprocess.run(as_postgres + [str(bindir / "initdb"), "-D", str(root / "data"), "--auth=trust", "-U", "postgres",
                                  "-E", "UTF8", "--locale=C", "--no-sync"], check=True, capture_output=True)
    port = free_port()
    options = f"-p {port} -c listen_addresses=127.0.0.1 -k {root} -c max_connections=40"
    subprocess.run(as_postgres + [str(bindir / "pg_ctl"), "-D", str(root / "data"), "-l", str(root / "server.log"),
                                  "-w", "-t", "30", "-o", options, "start"], check=True, capture_output=True)
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(as_postgres + [str(bindir / "pg_ctl"), "-D", str(root / "data"), "-m", "immediate", "-w",
                                      "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def start_gateway(stack, model, run_dir, store_url):  # -> (process, http port, grpc port)
    """A second gateway, not supervised, on the stack's scheduler and the same store."""
    ready = run_dir / "gateway-b.json"
    log = open(run_dir / "gateway-b.log", "wb")
    proc = subprocess.Popen([str(binary("ferry-gateway")), "--scheduler", stack.scheduler, "--tokenizer", str(model),
                             "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0", "--http-port", "0",
                             "--ready-file", str(ready), "--served-model-name", "m", f"--store-url={store_url}",
                             f"--batch-lease-s={LEASE_S}", f"--batch-concurrency={CONCURRENCY}",
                             f"--job-lease-s={LEASE_S}", f"--job-workers={JOB_WORKERS}"],
                            stdout=log, stderr=subprocess.STDOUT)
    http_ready = Path(str(ready) + ".http.json")
    deadline = time.time() + 60
    while not (http_ready.exists() and ready.exists()):  # the two are written one after the other
        assert proc.poll() is None, (run_dir / "gateway-b.log").read_text()[-3000:]
        assert time.time() < deadline, "gateway b not ready"
        time.sleep(0.05)
    return proc, json.loads(http_ready.read_text())["http_port"], json.loads(ready.read_text())["grpc_port"]


def test_two_gateways_on_one_postgresql_one_killed_the_other_finishes(tiny_model, tmp_path, postgres, pb):
    stack = Stack(tiny_model, tmp_path, ["--http-port", "0", "--served-model-name", "m",
                                         f"--gateway-arg=--store-url={postgres}",
                                         f"--gateway-arg=--batch-lease-s={LEASE_S}",
                                         f"--gateway-arg=--batch-concurrency={CONCURRENCY}",
                                         f"--gateway-arg=--job-lease-s={LEASE_S}",
                                         f"--gateway-arg=--job-workers={JOB_WORKERS}"])
    try:
        survivor = openai.OpenAI(base_url=stack.http + "/v1", api_key="unused", max_retries=0)
        before = finished_by_reason(stack.metrics_urls()["scheduler"])
        proc, port, grpc_port = start_gateway(stack, tiny_model, tmp_path, postgres)
        try:
            doomed = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
            job_ids = submit_jobs(pb, f"127.0.0.1:{grpc_port}")
            # A response stored through the doomed gateway, continued through the survivor (2 runs).
            first = doomed.responses.create(model="m", input="Tell me about rivers.", max_output_tokens=8,
                                            temperature=0)
            batch = create_batch(doomed)
            # One store: the batch made through one gateway is the other's too.
            assert survivor.batches.retrieve(batch.id).request_counts.total == LINES
            wait_completed_at_least(survivor, batch.id, LINES // 5)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            done = wait_completed_at_least(survivor, batch.id, LINES)
            check_output(survivor, batch=done)
            # One store: the doomed gateway's jobs are the survivor's to finish and to answer, and its
            # stored response the survivor's to read and continue.
            check_jobs(pb, stack.gateway, job_ids, wait_jobs(pb, stack.gateway, job_ids))
            assert survivor.responses.retrieve(first.id).output_text == first.output_text
            survivor.responses.create(model="m", input="And lakes?", previous_response_id=first.id,
                                      max_output_tokens=8, temperature=0)
            recorded = {s.labels["outcome"]: s.value
                        for s in scrape(stack.metrics_urls()["gateway"])["ferry_gateway_batch_lines"].samples
                        if s.name.endswith("_total")}
            assert 0 < recorded["completed"] <= LINES, recorded
            check_ran_once(before, finished_by_reason(stack.metrics_urls()["scheduler"]),
                           LINES + DIRECT + JOBS + DIRECT + 2,
                           f"{LINES} lines, {JOBS} jobs, {2 * DIRECT} direct checks, 2 responses")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        code = stack.stop()
    assert code == 0, stack.log_text()
