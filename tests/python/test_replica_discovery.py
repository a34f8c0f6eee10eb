"""Replica discovery (#31): the gateway follows a watched file of scheduler addresses. A replica added
to the file is routed to within a few seconds; a replica removed from it while requests run on it
is drained: every request ends normally with all its tokens, and no new request goes to it.
(--scheduler-dns takes the same path from a name's records; a DNS server is not started here.)"""
import time

import grpc
import pytest

from conftest import binary
from faults import Proc, requests_mix, run_streams, scrape

INTERVAL_S = 0.5  # --discovery-interval-s


def finished(proc):
    """Requests the scheduler has ended, every reason."""
    return sum(v for k, v in scrape(proc.metrics_port).items() if k.startswith("ferry_scheduler_requests_finished_total"))


def start_two_replicas(tiny_model, tmp_path, worker_args=()):
    log = open(tmp_path / "services.log", "wb")
    procs = {}
    try:
        for r in ("a", "b"):
            procs[f"worker_{r}"] = Proc(f"worker_{r}", [binary("ferry-worker"), "--model", str(tiny_model), "--port",
                                                        "0", "--num-kv-blocks", "512", *worker_args], tmp_path, log)
            procs[f"scheduler_{r}"] = Proc(f"scheduler_{r}", [binary("ferry-scheduler"), "--port", "0", "--worker",
                                                              procs[f"worker_{r}"].address], tmp_path, log)
        listing = tmp_path / "schedulers.txt"
        listing.write_text(f"# replica a only, to begin with\n{procs['scheduler_a'].address}\n")
        procs["gateway"] = Proc("gateway", [binary("ferry-gateway"), "--port", "0", "--scheduler-file", str(listing),
                                            "--discovery-interval-s", str(INTERVAL_S), "--tokenizer", str(tiny_model)],
                                tmp_path, log)
        yield procs, listing, tmp_path / "services.log"
    finally:
        for name in ("gateway", "scheduler_a", "scheduler_b", "worker_a", "worker_b"):
            if name in procs:
                procs[name].stop()
        log.close()


@pytest.fixture()
def two_replicas(tiny_model, tmp_path):
    yield from start_two_replicas(tiny_model, tmp_path)


ROUND = [0]


def fresh(pb, n, max_tokens, seeded=0):
    """n requests whose prompts no earlier request had (the router's prefix affinity would otherwise
    send them where their prompts went before)."""
    ROUND[0] += 1
    out = requests_mix(pb, n - seeded, seeded, max_tokens)
    for r in out:
        r.text = f"round {ROUND[0]} ".encode() + r.text
    return out


def all_ok(results, max_tokens):
    for rid, (tokens, _, code, details, _) in results.items():
        assert code == grpc.StatusCode.OK, (rid, code, details)
        assert len(tokens) == max_tokens, rid


def test_a_replica_added_to_the_file_is_routed_to_and_a_removed_one_drains(two_replicas, ferry_pb):
    procs, listing, log = two_replicas
    a, b, gateway = procs["scheduler_a"], procs["scheduler_b"], procs["gateway"]
    all_ok(run_streams(gateway.address, ferry_pb, fresh(ferry_pb, 4, 8)), 8)
    assert finished(a) == 4 and finished(b) == 0

    # Added: routed to within a few seconds (a discovery interval and a health check).
    listing.write_text(f"{a.address}\n{b.address}  # replica b joins\n")
    deadline = time.time() + 10
    while finished(b) == 0:
        assert time.time() < deadline, "the added replica got no request"
        all_ok(run_streams(gateway.address, ferry_pb, fresh(ferry_pb, 4, 8)), 8)
    assert "scheduler replica " + b.address + " added" in log.read_text()

    # Removed while 16 long streams run on both: each ends with all its tokens, and what comes after
    # goes to b alone.
    import threading
    results = {}
    streams = threading.Thread(target=lambda: results.update(
        run_streams(gateway.address, ferry_pb, fresh(ferry_pb, 16, 300, seeded=8), timeout_s=300)))
    before_a = finished(a)
    streams.start()
    time.sleep(1.0)  # the streams are on both replicas by now
    listing.write_text(f"{b.address}\n")
    time.sleep(3 * INTERVAL_S)
    streams.join(300)
    assert len(results) == 16
    all_ok(results, 300)
    drained_a = finished(a)
    assert drained_a > before_a, "replica a had none of the long streams: the removal drained nothing"
    all_ok(run_streams(gateway.address, ferry_pb, fresh(ferry_pb, 8, 8)), 8)
    assert finished(a) == drained_a, "a removed replica was sent new requests"
    assert "scheduler replica " + a.address + " removed" in log.read_text()

    # Listed again: served again.
    listing.write_text(f"{a.address}\n{b.address}\n")
    deadline = time.time() + 10
    while finished(a) == drained_a:
        assert time.time() < deadline, "the relisted replica got no request"
        all_ok(run_streams(gateway.address, ferry_pb, fresh(ferry_pb, 4, 8)), 8)


def test_an_unreadable_or_malformed_file_keeps_the_replicas(two_replicas, ferry_pb):
    procs, listing, log = two_replicas
    gateway = procs["gateway"]
    listing.write_text("not-an-address\n")
    time.sleep(3 * INTERVAL_S)
    all_ok(run_streams(gateway.address, ferry_pb, fresh(ferry_pb, 2, 8)), 8)
    assert 'line 1 "not-an-address": not host:port' in log.read_text()
    listing.unlink()
    time.sleep(3 * INTERVAL_S)
    all_ok(run_streams(gateway.address, ferry_pb, fresh(ferry_pb, 2, 8)), 8)
    assert "cannot be read; the replicas stay as they are" in log.read_text()


def test_a_replica_added_after_a_run_time_lora_load_gets_the_adapter(tiny_model, tmp_path, ferry_pb):
    """Issue #57: an adapter loaded through the gateway while only replica a is listed is loaded on
    replica b when discovery lists it (and the router sends b none of its requests before b's health
    check reports it); every request under it succeeds throughout."""
    import subprocess

    adapter = tmp_path / "adapter"
    subprocess.run([str(binary("ferry-make-model")), "--lora-for", str(tiny_model), "--out", str(adapter),
                    "--lora-rank", "4"], check=True, capture_output=True)
    replicas = start_two_replicas(tiny_model, tmp_path, ["--enable-lora", "--max-loras", "2"])
    procs, listing, log = next(replicas)
    try:
        a, b, gateway = procs["scheduler_a"], procs["scheduler_b"], procs["gateway"]
        admin = ferry_pb.lora_grpc.LoraAdaptersStub(grpc.insecure_channel(gateway.address))
        admin.Load(ferry_pb.lora.LoadLoraAdapterRequest(lora_name="ft", lora_path=str(adapter)), timeout=60)

        def served(proc):
            stub = ferry_pb.sched_grpc.SchedulerStub(grpc.insecure_channel(proc.address))
            return list(stub.Info(ferry_pb.sched.SchedulerInfoRequest(), timeout=10).lora_names)

        assert served(a) == ["ft"] and served(b) == [], "loaded on the listed replica only"
        stub = ferry_pb.gen_grpc.GenerationStub(grpc.insecure_channel(gateway.address))

        def generate():
            req = ferry_pb.gen.GenerateRequest(token_ids=ferry_pb.gen.TokenIds(ids=list(range(20, 40))),
                                               lora_name="ft",
                                               sampling=ferry_pb.gen.SamplingParams(max_tokens=6, ignore_eos=True))
            return list(stub.Generate(req, timeout=60).token_ids)

        want = generate()
        listing.write_text(f"{a.address}\n{b.address}\n")
        deadline = time.time() + 15
        while served(b) != ["ft"]:
            assert generate() == want, "a request under the adapter changed while replica b joined"
            assert time.time() < deadline, "the added replica never got the run-time adapter"
            time.sleep(0.2)
        assert f"new replica {b.address}: 1 run-time LoRA adapter(s) loaded" in log.read_text()
        for _ in range(6):
            assert generate() == want
    finally:
        next(replicas, None)
