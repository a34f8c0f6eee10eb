"""--quantization int8 through the whole stack: the worker runs W8A8, and greedy output does not
depend on what else shares the steps (the kernel's int32 sums are exact, so batching cannot
change a result); the flag is refused where it cannot run."""
import subprocess
from concurrent.futures import ThreadPoolExecutor

from conftest import REPO, Stack, binary

PROMPTS = [list(range(3, 3 + n)) for n in (5, 17, 40, 90)]


def generate(stub, ferry_pb, ids, max_tokens=16):
    req = ferry_pb.gen.GenerateRequest(token_ids=ferry_pb.gen.TokenIds(ids=ids), sampling=ferry_pb.gen.SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    return list(stub.Generate(req, timeout=120).token_ids)


def test_int8_stack_greedy_is_independent_of_batching(tiny_model, tmp_path, ferry_pb):
    import grpc

    s = Stack(tiny_model, tmp_path, ["--quantization", "int8", "--max-num-batched-tokens", "64"])
    try:
        cmdline = open(f"/proc/{s.ports['workers'][0]['pid']}/cmdline").read().split("\0")
        assert "--quantization=int8" in cmdline
        stub = ferry_pb.gen_grpc.GenerationStub(grpc.insecure_channel(s.gateway))
        alone = [generate(stub, ferry_pb, p) for p in PROMPTS]
        assert all(len(t) == 16 for t in alone)
        # All at once, twice over: prefills chunked at 64 tokens share steps with decodes.
        with ThreadPoolExecutor(len(PROMPTS) * 2) as pool:
            together = list(pool.map(lambda p: generate(stub, ferry_pb, p), PROMPTS * 2))
        assert together == alone * 2
        assert "quantization int8" in s.log_text()
    finally:
        assert s.stop() == 0, s.log_text()


def test_int8_is_refused_off_the_cpu_engine(tiny_model):
    out = subprocess.run([str(binary("ferry-worker")), "--model", str(tiny_model), "--backend", "sim", "--cost-model",
                          str(REPO / "tests/fixtures/sim_5ms.json"), "--quantization", "int8", "--port", "0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "--quantization int8 runs on the CPU engine only" in out.stdout + out.stderr
