"""tests/gpu/hf_compare.py's parity rule (numpy only, no GPU, no torch): logits that differ by rounding
noise pass, an argmax flip at the reference's near-tie is accepted and logged, and a real disagreement
(a flip across a wide reference gap, one logit far off, a top-5 swap across a wide gap) fails naming
its position. Without a GPU the script itself still skips with exit code 77."""
import subprocess
import sys

import numpy as np

from conftest import REPO

sys.path.insert(0, str(REPO / "tests/gpu"))
import hf_compare  # noqa: E402

TOL = 0.05  # hf_compare.py's default


def reference(positions=8, vocab=1000, seed=0):
    """Logits rows shaped like a random model's: N(0, 2), every row's top two 0.5 apart."""
    rows = np.random.default_rng(seed).normal(0.0, 2.0, (positions, vocab)).astype(np.float32)
    for r in rows:
        top = np.argsort(-r)[:2]
        r[top[0]] = r[top[1]] + 0.5
    return rows


def noisy(rows, size, seed=1):
    return rows + np.random.default_rng(seed).uniform(-size, size, rows.shape).astype(np.float32)


def test_rounding_noise_passes(capsys):
    ref = reference()
    report = hf_compare.parity_rule(noisy(ref, 0.02), ref, TOL)
    assert report["ok"], report["failures"]
    assert 0.015 < report["max_abs_error"] <= 0.02
    assert not report["flips"]
    assert "8 positions" in capsys.readouterr().out


def test_argmax_flip_at_a_near_tie_is_accepted_and_logged(capsys):
    ref = reference()
    a, b = np.argsort(-ref[3])[:2]
    ref[3, b] = ref[3, a] - 0.03  # HF's gap 0.03 is below the tolerance (>= 0.05)
    ours = ref.copy()
    ours[3, b] = ref[3, a] + 0.01
    report = hf_compare.parity_rule(ours, ref, TOL)
    assert report["ok"], report["failures"]
    assert len(report["flips"]) == 1 and report["flips"][0].startswith(f"position 3: argmax reference {a} vs ours {b}")
    assert "reference gap 0.03" in report["flips"][0]
    assert report["near_ties"] == 1
    assert f"position 3: argmax reference {a} vs ours {b}" in capsys.readouterr().out


def test_argmax_flip_across_a_wide_gap_fails():
    ref = reference()
    ours = noisy(ref, 0.01)
    a, b = np.argsort(-ref[2])[:2]
    ours[2, b] = ours[2, a] + 0.01  # a 0.5 gap in HF's logits: no rounding explains it
    report = hf_compare.parity_rule(ours, ref, TOL)
    assert not report["ok"]
    want = f"position 2: argmax reference {a} vs ours {b}: reference gap 0.5"
    assert any(f.startswith(want) for f in report["failures"]), report["failures"]
    assert all(f.startswith("position 2:") for f in report["failures"])


def test_one_logit_far_off_fails():
    ref = reference()
    ours = ref.copy()
    low = int(np.argmin(ref[5]))
    ours[5, low] += 1.0  # far below the top: only the error bound sees it
    report = hf_compare.parity_rule(ours, ref, TOL)
    assert [f.split(":")[0] for f in report["failures"]] == ["position 5"]
    assert "max |logit error| 1 >" in report["failures"][0]


def test_top5_swap_needs_a_near_tie():
    ref = reference()
    order = np.argsort(-ref[1])
    ref[1, order[:6]] = [10.0, 9.0, 8.0, 7.0, 6.0, 5.5]  # the reference's 5th/6th gap: 0.5
    ours = ref.copy()
    ours[1, order[5]] = 6.001  # yet the 5th and 6th swap
    report = hf_compare.parity_rule(ours, ref, 1.0)  # a tolerance the errors (0.5) pass
    assert report["ok"], report["failures"]
    report = hf_compare.parity_rule(ours, ref, 0.01)
    assert any(f.startswith("position 1: top-5 sets differ across a reference gap of 0.5 ") for f in report["failures"])
    ref[1, order[5]] = 5.99  # a near-tie: the same swap passes
    report = hf_compare.parity_rule(ours, ref, 0.01)
    assert report["ok"], report["failures"]


def test_shapes_must_match():
    ref = reference()
    assert not hf_compare.parity_rule(ref[:4], ref, TOL)["ok"]


def test_the_script_skips_without_a_gpu_or_torch(tmp_path):
    """Exit 77 where torch, transformers or a GPU is missing (every CI machine)."""
    done = subprocess.run([sys.executable, str(REPO / "tests/gpu/hf_compare.py"), "--model", str(tmp_path),
                           "--build", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 77, done.stdout + done.stderr
    assert "hf skipped" in done.stdout
