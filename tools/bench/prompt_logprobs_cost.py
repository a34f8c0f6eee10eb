#!/usr/bin/env python3
"""What scoring a prompt costs: /v1/completions with max_tokens 1, plain and with echo + logprobs
(the request lm-evaluation-harness sends for a loglikelihood), alternated, each on a fresh random
prompt so that the prefix cache never serves either.

  python3 tools/bench/prompt_logprobs_cost.py --url http://127.0.0.1:PORT --prompt-tokens 512 --repeats 5

Prints each pair and the medians; the difference over the prompt's tokens is the cost of scoring
one prompt token (its LM-head row, log-softmax and top-N).
"""
import argparse
import json
import random
import statistics
import time
import urllib.request


def complete(url: str, ids: list, echo: bool, top: int) -> float:
    body = {"prompt": ids, "max_tokens": 1, "temperature": 0}
    if echo:
        body.update({"echo": True, "logprobs": top})
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        out = json.loads(r.read())
    elapsed = time.perf_counter() - t0
    if echo:
        scored = out["choices"][0]["logprobs"]["token_logprobs"]
        assert len(scored) == len(ids) + 1 and scored[0] is None, "every prompt token scored"
    return elapsed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--top", type=int, default=1, help="logprobs: alternatives per token")
    ap.add_argument("--vocab", type=int, default=1000, help="prompt ids are drawn from [10, vocab)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    fresh = lambda: [rng.randrange(10, args.vocab) for _ in range(args.prompt_tokens)]
    complete(args.url, fresh(), False, args.top)  # warm-up
    plain, scored = [], []
    for i in range(args.repeats):
        plain.append(complete(args.url, fresh(), False, args.top))
        scored.append(complete(args.url, fresh(), True, args.top))
        print(f"pair {i + 1}: plain {plain[-1] * 1e3:.0f} ms, echo+logprobs={args.top} {scored[-1] * 1e3:.0f} ms")
    p, s = statistics.median(plain), statistics.median(scored)
    print(f"median over {args.repeats}: plain {p * 1e3:.0f} ms, echo+logprobs {s * 1e3:.0f} ms "
          f"({s / p:.2f}x); scoring costs {(s - p) / (args.prompt_tokens - 1) * 1e6:.0f} us a prompt token")


if __name__ == "__main__":
    main()
