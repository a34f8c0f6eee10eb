#!/usr/bin/env python3
"""Runs the ctest tests matching a regex one after another with no time limit: their command,
environment and working directory as ctest has them (ctest --show-only=json-v1). For the
minutes-long tests under ASan, where instrumentation takes some past ctest's 600 s (a timeout is
not a finding). Exit status 1 if any test failed.

    run_without_timeout.py BUILD_DIR REGEX
"""
import json
import os
import subprocess
import sys
import time


def main() -> int:
    build, regex = sys.argv[1], sys.argv[2]
    listing = subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1", "-R", regex],
                             check=True, capture_output=True, text=True).stdout
    failed = []
    tests = json.loads(listing)["tests"]
    for i, test in enumerate(tests, 1):
        props = {p["name"]: p["value"] for p in test.get("properties", [])}
        env = dict(os.environ)
        for kv in props.get("ENVIRONMENT", []):
            key, _, value = kv.partition("=")
            env[key] = value
        start = time.time()
        rc = subprocess.run(["nice", "-n", "19", *test["command"]], env=env,
                            cwd=props.get("WORKING_DIRECTORY", build), stdout=subprocess.DEVNULL).returncode
        status = "passed" if rc == 0 else f"FAILED (exit {rc})"
        print(f"{i}/{len(tests)} {test['name']}: {status} in {time.time() - start:.0f} s", flush=True)
        if rc != 0:
            failed.append(test["name"])
    print(f"{len(tests) - len(failed)} of {len(tests)} passed" + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
