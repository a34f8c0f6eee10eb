"""ferry-launch restarts nothing silently: with --restart-policy never a child
that dies is logged and fails the stack (restarts under the default policy:
test_launch_supervision.py); SIGTERM stops every child and exits 0 (checked by
the session stack fixture's teardown)."""
import os
import signal
import time

from conftest import Stack


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_dead_worker_fails_the_stack_under_restart_policy_never(tiny_model, tmp_path):
    s = Stack(tiny_model, tmp_path, ["--restart-policy", "never"])
    worker_pid = s.ports["workers"][0]["pid"]
    others = [s.ports["scheduler"]["pid"], s.ports["gateway"]["pid"]]
    os.kill(worker_pid, signal.SIGKILL)
    code = s.proc.wait(timeout=30)
    log = s.log_text()
    assert code == 1, log
    assert f"worker-0 (pid {worker_pid}) killed by signal 9" in log, log
    deadline = time.time() + 10
    while any(pid_alive(p) for p in others) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(pid_alive(p) for p in others), "launch left children running"
    s.stop()


def test_sigterm_stops_all_children(tiny_model, tmp_path):
    s = Stack(tiny_model, tmp_path)
    pids = [w["pid"] for w in s.ports["workers"]] + [s.ports["scheduler"]["pid"], s.ports["gateway"]["pid"]]
    assert s.stop() == 0, s.log_text()
    assert not any(pid_alive(p) for p in pids)


def test_vllm_engine_flags_reach_the_services_that_own_them(tiny_model, tmp_path, ferry_pb):
    import grpc

    # A flag also passed through (--scheduler-arg) wins over the forwarded one.
    s = Stack(tiny_model, tmp_path, ["--max-num-seqs", "5", "--scheduler-arg=--max-num-seqs=3",
                                     "--worker-arg=--max-num-seqs=3", "--max-num-batched-tokens", "256",
                                     "--max-model-len", "200", "--block-size", "32", "--no-enable-prefix-caching",
                                     "--controller-mode", "static", "--dtype", "float32"])
    try:
        stub = ferry_pb.sched_grpc.SchedulerStub(grpc.insecure_channel(s.scheduler))
        state = stub.GetState(ferry_pb.sched.GetStateRequest(), timeout=30)
        assert state.max_num_seqs == 3 and state.controller_mode == "static"
        info = stub.Info(ferry_pb.sched.SchedulerInfoRequest(), timeout=30)
        assert info.max_model_len == 200 and info.block_size == 32
        gen = ferry_pb.gen_grpc.GenerationStub(grpc.insecure_channel(s.gateway))
        prompt = ferry_pb.gen.TokenIds(ids=list(range(1, 65)))  # 64 tokens: two full blocks
        for _ in range(2):
            gen.Generate(ferry_pb.gen.GenerateRequest(token_ids=prompt, sampling=ferry_pb.gen.SamplingParams(
                max_tokens=2)), timeout=60)
        # Prefix caching off: the second identical prompt reuses no block.
        assert stub.GetState(ferry_pb.sched.GetStateRequest(), timeout=30).prefix_cache_hits == 0
        with_cli = " ".join(open(f"/proc/{s.ports['workers'][0]['pid']}/cmdline").read().split("\0"))
        assert "--dtype=float32" in with_cli and "--max-num-batched-tokens=256" in with_cli
    finally:
        assert s.stop() == 0, s.log_text()


def test_no_process_of_the_stack_dies_of_a_broken_pipe(stack):
    """Every Ferry process ignores SIGPIPE (issue #53): a write to a peer that died is an error its
    code reports, not the process's death (a CPU tensor-parallel rank exited 141 that way)."""
    pids = {"ferry-launch": stack.proc.pid, "gateway": stack.ports["gateway"]["pid"],
            "scheduler": stack.ports["scheduler"]["pid"]}
    pids.update({f"worker-{i}": w["pid"] for i, w in enumerate(stack.ports["workers"])})
    for name, pid in pids.items():
        status = open(f"/proc/{pid}/status").read()
        ignored = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16)
        assert ignored & (1 << (signal.SIGPIPE - 1)), f"{name} (pid {pid}) does not ignore SIGPIPE"
