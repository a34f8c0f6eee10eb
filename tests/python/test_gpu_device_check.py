"""tests/gpu/device_check.sh on a machine without a GPU (every CI machine): it prints the environment,
writes its summary into the folder it is given, says "no GPU" and stops with exit code 3 instead of
crashing, and leaves at most 8 files there (what the device tool returns)."""
import os
import shutil
import subprocess

from conftest import REPO


def test_device_check_without_a_gpu_reports_no_gpu_cleanly(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, SKIP_BUILD="1", FERRY_GPU_BUILD=str(tmp_path / "no-build"), DEADLINE_S="60",
               FERRY_GPU_DEPS=str(tmp_path / "no-deps"),  # not this checkout's .gpu-deps, if it has one
               PATH="/usr/bin:/bin")  # no nvidia-smi, whatever this machine has
    done = subprocess.run(["bash", str(REPO / "tests/gpu/device_check.sh"), str(out)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 3, done.stdout + done.stderr
    summary = (out / "summary.md").read_text()
    assert "no GPU: nothing to run on a device" in summary, summary
    assert "nvidia-smi:" in summary and "nvcc:" in summary, summary
    assert "| build | PASS |" in summary, summary
    assert len(list(out.iterdir())) <= 8


def run_check_with_prebuilt(tmp_path, stamp):
    deps, stage = tmp_path / "deps", tmp_path / "stage"
    for d in ("bin", "tests"):
        (stage / d).mkdir(parents=True)
        shutil.copy("/bin/true", stage / d / "tool")  # loads anywhere
    deps.mkdir()
    subprocess.run(f"tar -C {stage} -cf - bin tests | xz > {deps / 'prebuilt.tar.xz'}", shell=True, check=True)
    (deps / "prebuilt.stamp").write_text(stamp + "\n")
    out = tmp_path / "out"
    env = dict(os.environ, SKIP_BUILD="1", FERRY_GPU_BUILD=str(tmp_path / "no-build"), DEADLINE_S="60",
               FERRY_GPU_DEPS=str(deps), PATH="/usr/bin:/bin")
    done = subprocess.run(["bash", str(REPO / "tests/gpu/device_check.sh"), str(out)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 3, done.stdout + done.stderr
    return (out / "summary.md").read_text(), (out / "build.log").read_text()


def test_device_check_uses_binaries_prebuilt_from_this_very_tree_only(tmp_path):
    stamp = subprocess.run(["bash", "tests/gpu/source_stamp.sh"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.strip()
    assert len(stamp) == 16
    summary, log = run_check_with_prebuilt(tmp_path / "same", stamp)
    assert f"| build | prebuilt on the development machine ({stamp}) | 0 s |" in summary, summary
    summary, log = run_check_with_prebuilt(tmp_path / "other", "0123456789abcdef")
    assert "| build | PASS |" in summary and "prebuilt" not in summary, summary
    assert f"prebuilt binaries are of another tree (0123456789abcdef, this one is {stamp})" in log, log


def test_worker_refuses_gpu_flags_it_cannot_honour_at_start(tiny_model):
    """--device cuda flags the GPU engine cannot honour are refused before anything loads (on any
    machine: the check runs before the GPU plugin), naming the flag, the value and the limit."""
    import subprocess as sp

    from conftest import binary

    for flags, message in [(["--dtype", "float32"], "--dtype float32 is not supported with --device cuda"),
                           (["--max-num-seqs", "512", "--max-num-batched-tokens", "256"],
                            "--max-num-seqs 512 must be <= --max-num-batched-tokens 256")]:
        done = sp.run([str(binary("ferry-worker")), "--model", str(tiny_model), "--device", "cuda", "--port", "0",
                       *flags], capture_output=True, text=True, timeout=60)
        assert done.returncode == 1, done.stdout + done.stderr
        assert message in done.stdout + done.stderr, done.stdout + done.stderr
