#!/usr/bin/env python3
"""Speculative decoding by prompt lookup, single stream, through the real services (issue #32).

Starts one stack (ferry-launch) whose worker has --speculative-config ngram as its default, then sends
each prompt of a copy-natural set one at a time, twice: with sampling.speculative.method = "none" (plain
decoding) and with the server's default (speculating), in alternation so that both see the same machine.
Prints per prompt and overall: decode tokens/s of each, the speedup, tokens per speculating step and the
acceptance rate (from the worker's ferry_worker_spec_decode_tokens_total), and checks that the two
return the same token ids (exit status 1 if any differ).

The prompt set: editing, rewriting and summarising tasks over paragraphs of this repository's own
documents (README.md and docs/*.md: English prose with code and identifiers), and code edits over its
sources: tasks whose answer naturally copies long spans of the prompt. How it is built is fixed here
(PROMPT_TEMPLATES, the paragraph rule in paragraphs()), never tuned on the results.

    python3 tools/bench/speculative_bench.py --build-dir build --model /tmp/q05 --max-tokens 128
"""
import argparse
import json
import os
import re
import signal
import sys
import time
import urllib.request
from pathlib import Path

from e2e_load import REPO, load_stubs, start_stack  # tools/bench/e2e_load.py, beside this file

PROMPT_TEMPLATES = [
    "Fix the spelling and grammar in the text below. Return the whole text, otherwise unchanged.\n\n"
    "Text:\n{doc}\n\nCorrected text:\n",
    "Rewrite the text below for a newcomer, keeping every sentence and every technical term.\n\n"
    "{doc}\n\nRewritten text:\n",
    "Summarise the text below, quoting its key phrases word for word.\n\n{doc}\n\nSummary:\n",
    "Add a comment above each function in the code below and return the full code.\n\n```cpp\n{code}\n```\n\n"
    "```cpp\n",
]


def paragraphs(limit):
    """Prose paragraphs of 60 to 160 words from README.md and docs/*.md, in file order."""
    out = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for block in re.split(r"\n\s*\n", path.read_text()):
            words = block.split()
            if 60 <= len(words) <= 160 and not block.lstrip().startswith(("|", "```", "#")):
                out.append(" ".join(words))
    step = max(1, len(out) // limit)
    return out[::step][:limit]


def code_snippets(limit):
    """The first 40 lines of some small sources of the repository."""
    files = sorted((REPO / "worker/model").glob("*.cc"))
    step = max(1, len(files) // limit)
    return ["\n".join(f.read_text().splitlines()[:40]) for f in files[::step][:limit]]


def prompt_set(num_docs):
    docs, code = paragraphs(num_docs), code_snippets(max(1, num_docs // 3))
    prompts = []
    for i, doc in enumerate(docs):
        prompts.append(PROMPT_TEMPLATES[i % 3].format(doc=doc))
    prompts += [PROMPT_TEMPLATES[3].format(code=c) for c in code]
    return prompts


def spec_counts(metrics_url):
    text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
    counts = {}
    for kind in ("drafts", "draft", "accepted"):
        m = re.search(r'ferry_worker_spec_decode_tokens_total\{kind="%s"\} (\S+)' % kind, text)
        counts[kind] = float(m.group(1)) if m else 0.0
    return counts


def sources(ids, prompt_ids, n=4):
    """Where the output's n-grams come from: the share found in the prompt, and the share found only
    earlier in the output itself (a model repeating itself). A random-weight model copies little and
    repeats much; a trained one on these tasks copies."""
    prompt_grams = {tuple(prompt_ids[i:i + n]) for i in range(len(prompt_ids) - n + 1)}
    copied = repeated = 0
    for i in range(n - 1, len(ids)):
        gram = tuple(ids[i - n + 1:i + 1])
        if gram in prompt_grams:
            copied += 1
        elif any(tuple(ids[j:j + n]) == gram for j in range(i - n + 1)):
            repeated += 1
    total = max(1, len(ids) - n + 1)
    return copied / total, repeated / total


def run_one(stub, pb, prompt, max_tokens, method):
    params = pb.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    if method:  # vLLM's name, as the wire's enum
        params.speculative.method = pb.SpeculativeMethod.Value("SPECULATIVE_METHOD_" + method.upper())
    req = pb.GenerateRequest(text=prompt.encode(), sampling=params)
    start = time.perf_counter()
    first = last = None
    ids = []
    for chunk in stub.GenerateStream(req, timeout=600):
        if chunk.token_ids:
            now = time.perf_counter()
            first = first or now
            last = now
            ids += list(chunk.token_ids)
    return ids, first - start, last - first


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.environ.get("FERRY_BUILD_DIR", str(REPO / "build")))
    ap.add_argument("--model", required=True)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--num-docs", type=int, default=12, help="paragraphs (plus a third as many code snippets)")
    ap.add_argument("--num-speculative-tokens", type=int, default=4)
    ap.add_argument("--prompt-lookup-max", type=int, default=4)
    ap.add_argument("--prompt-lookup-min", type=int, default=2)
    ap.add_argument("--draft-model", help="a draft checkpoint: method draft_model instead of ngram")
    ap.add_argument("--launch-arg", action="append", default=[], help="extra ferry-launch argument (repeatable)")
    args = ap.parse_args()

    import grpc

    if args.draft_model:
        config = json.dumps({"method": "draft_model", "model": args.draft_model,
                             "num_speculative_tokens": args.num_speculative_tokens})
    else:
        config = json.dumps({"method": "ngram", "num_speculative_tokens": args.num_speculative_tokens,
                             "prompt_lookup_max": args.prompt_lookup_max, "prompt_lookup_min": args.prompt_lookup_min})
    pb, pb_grpc = load_stubs()
    args.launch_arg = ["--speculative-config", config, *args.launch_arg]
    proc, ports = start_stack(args)
    try:
        metrics = f"http://127.0.0.1:{ports['workers'][0]['metrics_port']}/metrics"
        stub = pb_grpc.GenerationStub(grpc.insecure_channel(f"127.0.0.1:{ports['gateway']['grpc_port']}"))
        return measure(stub, pb, metrics, args, config)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def measure(stub, pb, metrics, args, config):
    prompts = prompt_set(args.num_docs)
    run_one(stub, pb, "warm up", 8, "none")
    print(f"speculative config {config}; {len(prompts)} prompts, {args.max_tokens} greedy tokens each, one at a time")
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(args.model) / "tokenizer.json"))
    print("| prompt | prompt tokens | plain tok/s | speculative tok/s | speedup | tokens/step | acceptance | "
          "output 4-grams from the prompt / repeating the output |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    copied_sum = repeated_sum = 0.0
    plain_time = spec_time = 0.0
    total_tokens = 0
    mismatches = 0
    start_counts = spec_counts(metrics)
    for i, prompt in enumerate(prompts):
        plain_ids, _, plain_decode = run_one(stub, pb, prompt, args.max_tokens, "none")
        before = spec_counts(metrics)
        spec_ids, _, spec_decode = run_one(stub, pb, prompt, args.max_tokens, "")
        after = spec_counts(metrics)
        if plain_ids != spec_ids:
            mismatches += 1
            print(f"prompt {i}: tokens differ at {next(j for j, (a, b) in enumerate(zip(plain_ids, spec_ids)) if a != b)}")
        n = len(plain_ids) - 1  # decode tokens (the first comes from the prefill)
        plain_time += plain_decode
        spec_time += spec_decode
        total_tokens += n
        drafts = after["drafts"] - before["drafts"]
        accepted = after["accepted"] - before["accepted"]
        drafted = after["draft"] - before["draft"]
        per_step = (accepted + drafts) / drafts if drafts else 1.0
        rate = accepted / drafted if drafted else 0.0
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False).ids
        copied, repeated = sources(plain_ids, prompt_ids)
        copied_sum += copied
        repeated_sum += repeated
        print(f"| {i} | {len(prompt_ids)} | {n / plain_decode:.1f} | {n / spec_decode:.1f} | "
              f"{plain_decode / spec_decode:.2f}x | {per_step:.2f} | {rate:.0%} | {copied:.0%} / {repeated:.0%} |")
    end_counts = spec_counts(metrics)
    drafts = end_counts["drafts"] - start_counts["drafts"]
    accepted = end_counts["accepted"] - start_counts["accepted"]
    drafted = end_counts["draft"] - start_counts["draft"]
    print(f"\nall: plain {total_tokens / plain_time:.1f} tok/s, speculative {total_tokens / spec_time:.1f} tok/s, "
          f"speedup {plain_time / spec_time:.2f}x; tokens per speculating step "
          f"{(accepted + drafts) / max(drafts, 1):.2f}, acceptance {accepted / max(drafted, 1):.0%}; "
          f"identical greedy tokens: {len(prompts) - mismatches}/{len(prompts)}; output 4-grams from the prompt "
          f"{copied_sum / len(prompts):.0%}, repeating the output {repeated_sum / len(prompts):.0%}")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
