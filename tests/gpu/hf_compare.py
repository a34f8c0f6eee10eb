#!/usr/bin/env python3
"""Ferry's GPU engine against Hugging Face transformers on the same random checkpoint.

1. Logits: ferry-gpu-logits greedy-decodes a prompt; transformers' Qwen2 (fp32) runs the same
   ids in one forward pass; the logits at each sampled position must agree within the bf16
   engine's tolerance and give the same greedy token.
2. Throughput: transformers generate, bf16, greedy, static batches of 32 prompts of 512 random
   ids generating exactly 128 tokens: output tokens/s (the issue's 20x baseline).

Exits 77 (skip) when torch or transformers is missing, or no GPU is visible.
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

try:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM
except ImportError as e:  # pragma: no cover - depends on the machine
    print(f"hf skipped: {e}")
    sys.exit(77)


def compare_logits(build, model, prompt_len, steps, tol):
    prefix = Path("/tmp") / f"ferry_logits_{Path(model).name}"
    subprocess.run([str(Path(build) / "bin" / "ferry-gpu-logits"), "--model-dir", model, "--out", str(prefix),
                    "--prompt-len", str(prompt_len), "--steps", str(steps)], check=True)
    meta = json.loads(prefix.with_suffix(".json").read_text())
    ours = np.fromfile(prefix.with_suffix(".f32"), dtype=np.float32).reshape(steps, meta["vocab"])
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).cuda().eval()
    ids = meta["prompt"] + meta["generated"][:-1]
    with torch.no_grad():
        logits = hf(torch.tensor([ids], device="cuda")).logits[0].float().cpu().numpy()
    theirs = logits[len(meta["prompt"]) - 1:len(meta["prompt"]) - 1 + steps, :meta["vocab"]]
    diff = float(np.abs(ours - theirs).max())
    scale = float(np.abs(theirs).max())
    same_argmax = bool((ours.argmax(axis=1) == theirs.argmax(axis=1)).all())
    ok = same_argmax and diff <= tol * scale + tol
    print(f"hf logits {Path(model).name}: max |diff| {diff:.4g} (|logits| up to {scale:.3g}), "
          f"greedy tokens {'identical' if same_argmax else 'DIFFER'}: {'ok' if ok else 'FAIL'}")
    del hf
    torch.cuda.empty_cache()
    return ok, diff, scale


def hf_generate_throughput(model, batch, prompt_len, output_len, batches):
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16).cuda().eval()
    vocab = hf.config.vocab_size
    gen = torch.Generator().manual_seed(0)

    def one_batch():
        ids = torch.randint(0, vocab, (batch, prompt_len), generator=gen).cuda()
        with torch.no_grad():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=output_len,
                              min_new_tokens=output_len, pad_token_id=0)
        assert out.shape[1] == prompt_len + output_len
        torch.cuda.synchronize()

    one_batch()  # warm-up
    start = time.perf_counter()
    for _ in range(batches):
        one_batch()
    seconds = time.perf_counter() - start
    tps = batch * output_len * batches / seconds
    print(f"hf generate: static batches of {batch}, {prompt_len} prompt / {output_len} output: {tps:.0f} output tokens/s")
    return tps


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, help="qwen2.5-0.5b-shaped checkpoint")
    p.add_argument("--tiny", help="tiny checkpoint (optional, compared too)")
    p.add_argument("--build", required=True, help="build dir holding bin/ferry-gpu-logits")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--tol", type=float, default=0.05)
    p.add_argument("--batches", type=int, default=2)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("hf skipped: torch sees no GPU")
        sys.exit(77)
    results, ok = {}, True
    for name, model in (("tiny", args.tiny), ("qwen", args.model)):
        if model and (Path(model) / "model.safetensors").exists():
            good, diff, scale = compare_logits(args.build, model, 37, 8, args.tol)
            ok &= good
            results[f"{name}_logits_max_diff"] = diff
            results[f"{name}_logits_scale"] = scale
    results["hf_generate_tokens_per_s"] = hf_generate_throughput(args.model, 32, 512, 128, args.batches)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
