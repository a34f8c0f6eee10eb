"""ferry-bench against the real stack: the tiny model over gRPC and HTTP, and the sim backend
(4090D cost model) for the max_num_seqs sweep. Assertions are on the JSON it writes (counts,
statuses, that the sweep set the cap through the admin RPC), never on timings."""
import json
import subprocess

import grpc
import pytest

from conftest import REPO, Stack, binary

PRESET = REPO / "scheduler" / "sim" / "presets" / "rtx4090d-tp4.json"


def bench(*args, expect_rc=0, timeout=300):
    proc = subprocess.run([str(binary("ferry-bench")), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == expect_rc, f"rc {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def tiny_stack(tiny_model, tmp_path_factory):
    s = Stack(tiny_model, tmp_path_factory.mktemp("bench-tiny"), ["--http-port", "0"])
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def sim_stack(tiny_model, tmp_path_factory):
    s = Stack(tiny_model, tmp_path_factory.mktemp("bench-sim"),
              ["--worker-arg=--backend=sim", f"--worker-arg=--cost-model={PRESET}",
               "--worker-arg=--sim-live-tokens=1000", "--scheduler-arg=--max-num-seqs=64"])
    yield s
    assert s.stop() == 0


def run_json(stack, tmp_path, *args, expect_rc=0):
    out = tmp_path / "run.json"
    bench("run", "--stack-file", stack.ready_file, "--no-progress", "--json", out, *args, expect_rc=expect_rc)
    return json.loads(out.read_text())


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_run_against_the_tiny_model(tiny_stack, tmp_path, protocol):
    requests = tmp_path / "requests.jsonl"
    r = run_json(tiny_stack, tmp_path, "--protocol", protocol, "--num-requests", 12, "--concurrency", 4,
                 "--input-len", "uniform:8:24", "--output-len", 8, "--seed", 3, "--requests-jsonl", requests)
    assert r["completed"] == 12 and r["failed"] == 0 and r["not_sent"] == 0
    assert r["status_counts"] == {"OK": 12}
    assert r["total_output_tokens"] == 12 * 8  # ignore_eos: exactly max_tokens each
    assert 12 * 8 <= r["total_input_tokens"] <= 12 * 24
    assert 0 < r["median_ttft_ms"] <= r["p99_ttft_ms"]
    assert 0 < r["mean_tpot_ms"] and 0 < r["mean_itl_ms"]
    assert r["p99_e2el_ms"] >= r["median_e2el_ms"] >= r["median_ttft_ms"]
    assert r["output_throughput"] > 0
    assert r["config"]["protocol"] == protocol and r["config"]["load"] == "closed"
    # Scraped from the services' /metrics while it ran.
    assert r["metrics_scrapes"] >= 2
    assert r["mean_num_running"] is not None and r["engine_utilization"] is not None
    lines = [json.loads(x) for x in requests.read_text().splitlines()]
    assert [x["index"] for x in lines] == list(range(12))
    assert all(x["status"] == "OK" and x["output_tokens"] == 8 for x in lines)


def test_failed_requests_are_counted_by_status(tiny_stack, tmp_path):
    # Ids 2000..2099 on a 2,048-token vocabulary: about half the one-token prompts are invalid.
    r = run_json(tiny_stack, tmp_path, "--num-requests", 40, "--concurrency", 4, "--input-len", 1,
                 "--output-len", 2, "--token-id-min", 2000, "--token-id-max", 2100, "--seed", 1)
    assert r["completed"] + r["failed"] == 40
    assert r["failed"] > 0 and r["completed"] > 0
    assert r["status_counts"]["INVALID_ARGUMENT"] == r["failed"]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_sampling_flags_reach_the_server(tiny_stack, tmp_path, protocol):
    # Qwen2.5-Instruct's generation defaults, as the GPU check's sampled run sends them: served, and recorded.
    flags = ["--temperature", 0.7, "--top-p", 0.8, "--top-k", 20, "--repetition-penalty", 1.05]
    r = run_json(tiny_stack, tmp_path, "--protocol", protocol, "--num-requests", 6, "--concurrency", 3,
                 "--input-len", 8, "--output-len", 4, *flags)
    assert r["status_counts"] == {"OK": 6}
    c = r["config"]
    assert (c["top_p"], c["top_k"], c["min_p"]) == (pytest.approx(0.8), 20, None)
    assert c["repetition_penalty"] == pytest.approx(1.05) and c["temperature"] == pytest.approx(0.7)
    # Each flag is sent: a value out of its range fails every request on the server's validation.
    for flag, bad in [("--top-p", 1.5), ("--top-k", -3), ("--min-p", 2), ("--repetition-penalty", -1)]:
        r = run_json(tiny_stack, tmp_path, "--protocol", protocol, "--num-requests", 2, "--concurrency", 2,
                     "--input-len", 8, "--output-len", 2, flag, bad, expect_rc=2)
        assert r["failed"] == 2, (flag, r["status_counts"])
        assert set(r["status_counts"]) <= {"INVALID_ARGUMENT", "HTTP_400"}, (flag, r["status_counts"])


def test_unreachable_gateway_fails_every_request_and_still_reports(tmp_path):
    out = tmp_path / "dead.json"
    bench("run", "--target", "127.0.0.1:1", "--no-progress", "--num-requests", 5, "--concurrency", 2,
          "--request-timeout-s", 2, "--json", out, expect_rc=2)
    r = json.loads(out.read_text())
    assert r["completed"] == 0 and r["failed"] == 5
    assert sum(r["status_counts"].values()) == 5


def test_request_timeout_is_a_counted_failure(sim_stack, tmp_path):
    # 200 tokens take > 50 ms on the 4090D model (fixed step cost alone is 0.22 ms x 200).
    r = run_json(sim_stack, tmp_path, "--num-requests", 6, "--concurrency", 3, "--input-len", 32,
                 "--output-len", 200, "--request-timeout-s", 0.02, expect_rc=2)
    assert r["completed"] == 0 and r["failed"] == 6
    # The client's deadline (DEADLINE_EXCEEDED) or the gateway ending the stream at that deadline
    # (finish reason TIMEOUT), whichever notices first.
    assert set(r["status_counts"]) <= {"DEADLINE_EXCEEDED", "FINISH_TIMEOUT"}
    assert sum(r["status_counts"].values()) == 6


def test_duration_bounds_an_open_loop_run(sim_stack, tmp_path):
    # 1,000 requests due over ~100 s; the run stops sending after 1 s and records the rest.
    r = run_json(sim_stack, tmp_path, "--num-requests", 1000, "--request-rate", 10, "--duration-s", 1,
                 "--input-len", 32, "--output-len", 4, "--seed", 2)
    assert r["config"]["load"] == "open"
    assert r["not_sent"] > 900 and r["completed"] + r["failed"] + r["not_sent"] == 1000
    assert r["status_counts"]["NOT_SENT"] == r["not_sent"]


def test_replays_a_ferry_sim_trace(sim_stack, tmp_path):
    trace = tmp_path / "trace.jsonl"
    lines = [{"arrival_s": 0.02 * i, "prompt_tokens": 40 + i, "output_tokens": 5 + i % 3,
              "lane": "interactive" if i % 2 else "batch", **({"prefix_id": 1, "prefix_tokens": 16} if i < 4 else {})}
             for i in range(10)]
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = run_json(sim_stack, tmp_path, "--trace", trace)
    assert r["completed"] == 10
    assert r["total_output_tokens"] == sum(x["output_tokens"] for x in lines)
    assert r["total_input_tokens"] == sum(x["prompt_tokens"] for x in lines)
    assert r["lanes"]["interactive"]["completed"] == 5 and r["lanes"]["batch"]["completed"] == 5


def test_a_trace_is_replayed_open_loop(sim_stack, tmp_path):
    """Requests due together are in flight together: a trace is sent at its arrival times, not by one
    closed-loop client (it was: --concurrency's default of 1 serialised every replay)."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": 0.001 * i, "prompt_tokens": 32, "output_tokens": 64,
                                         "lane": "batch"}) + "\n" for i in range(8)))
    records = tmp_path / "requests.jsonl"
    r = run_json(sim_stack, tmp_path, "--trace", trace, "--requests-jsonl", records)
    assert r["completed"] == 8 and r["config"]["load"] == "trace"
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    first_end = min(x["send_s"] + x["e2el_ms"] / 1e3 for x in rows)
    # 64 steps of the modelled GPU each: every request was sent before the first one ended.
    assert all(x["send_s"] < first_end for x in rows), rows
    assert "exclude each other" in bench("run", "--stack-file", sim_stack.ready_file, "--trace", trace,
                                         "--concurrency", 2, expect_rc=1).stderr


def test_sweep_sets_the_cap_through_the_admin_rpc(sim_stack, tmp_path, ferry_pb):
    """The sweep holds each cap (the stack runs the default goodput controller, which would otherwise
    move it under the measurement) and leaves the cap as it found it: held at 12 here."""
    sched = ferry_pb.sched_grpc.SchedulerStub(grpc.insecure_channel(sim_stack.scheduler))
    before = sched.SetMaxNumSeqs(ferry_pb.sched.SetMaxNumSeqsRequest(max_num_seqs=12), timeout=10)
    assert (before.controller_mode, before.max_num_seqs, before.cap_held) == ("goodput", 12, True)
    out = tmp_path / "sweep"
    proc = bench("sweep", "--stack-file", sim_stack.ready_file, "--no-progress", "--max-num-seqs", "1,4,8",
                 "--concurrency", "cap", "--num-requests", 16, "--input-len", 64, "--output-len", 16,
                 "--goodput", "e2el:5000", "--out-dir", out)
    s = json.loads((out / "sweep.json").read_text())
    caps = [p["max_num_seqs"] for p in s["points"]]
    assert caps == [1, 4, 8]
    for p in s["points"]:
        assert p["applied_max_num_seqs"] == p["max_num_seqs"] == p["read_max_num_seqs"]
        assert p["max_num_seqs_metric"] == p["max_num_seqs"]  # the scheduler's own gauge agreed
        assert p["completed"] == 16 and p["failed"] == 0
        assert p["config"]["concurrency"] == p["max_num_seqs"]  # --concurrency cap
        assert p["mean_num_running"] <= p["max_num_seqs"] + 1e-9
    assert s["recommendation"]["max_num_seqs"] in caps
    after = sched.GetState(ferry_pb.sched.GetStateRequest(), timeout=10)
    assert (after.max_num_seqs, after.cap_held) == (12, True)  # restored
    assert after.num_cap_changes >= before.num_cap_changes + 4  # three points and the restore
    md = (out / "sweep.md").read_text()
    assert "| max_num_seqs | engine util | tokens/s (output) | P99 ms (E2EL) | memory | success |" in md
    assert "Recommended max_num_seqs" in md and "Recommended max_num_seqs" in proc.stdout
    for chart in ["throughput_vs_cap.svg", "p99_vs_cap.svg", "throughput_vs_p99.svg"]:
        assert (out / chart).read_text().startswith("<svg")
    assert len((out / "sweep.csv").read_text().splitlines()) == 4


def test_sweep_leaves_an_adapting_controller_adapting(sim_stack, tmp_path, ferry_pb):
    sched = ferry_pb.sched_grpc.SchedulerStub(grpc.insecure_channel(sim_stack.scheduler))
    state = sched.SetMaxNumSeqs(ferry_pb.sched.SetMaxNumSeqsRequest(max_num_seqs=12, adapt=True), timeout=10)
    assert not state.cap_held
    bench("sweep", "--stack-file", sim_stack.ready_file, "--no-progress", "--max-num-seqs", "4",
          "--concurrency", "cap", "--num-requests", 8, "--input-len", 64, "--output-len", 16,
          "--out-dir", tmp_path / "sweep")
    point, = json.loads((tmp_path / "sweep" / "sweep.json").read_text())["points"]
    assert point["applied_max_num_seqs"] == point["read_max_num_seqs"] == 4  # held while measured
    after = sched.GetState(ferry_pb.sched.GetStateRequest(), timeout=10)
    assert (after.controller_mode, after.cap_held) == ("goodput", False)

