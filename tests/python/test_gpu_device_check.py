"""tests/gpu/device_check.sh on a machine without a GPU (every CI machine): it prints the environment,
writes its summary into the folder it is given, says "no GPU" and stops with exit code 3 instead of
crashing, and leaves at most 8 files there (what the device tool returns)."""
import os
import subprocess

from conftest import REPO


def test_device_check_without_a_gpu_reports_no_gpu_cleanly(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, SKIP_BUILD="1", FERRY_GPU_BUILD=str(tmp_path / "no-build"), DEADLINE_S="60",
               PATH="/usr/bin:/bin")  # no nvidia-smi, whatever this machine has
    done = subprocess.run(["bash", str(REPO / "tests/gpu/device_check.sh"), str(out)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 3, done.stdout + done.stderr
    summary = (out / "summary.md").read_text()
    assert "no GPU: nothing to run on a device" in summary, summary
    assert "nvidia-smi:" in summary and "nvcc:" in summary, summary
    assert "| build | PASS |" in summary, summary
    assert len(list(out.iterdir())) <= 8
