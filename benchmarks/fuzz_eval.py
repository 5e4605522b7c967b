"""Fuzz every option of ``flowgrpo eval`` with bad values, each in its own process: every run must end with exit 0 or
with one line and exit 2, never a traceback. Prints one JSON line per run and the counts.

    python benchmarks/fuzz_eval.py [--jobs 2]

The model is the tiny SD3 (one prompt, one step); the benchmark options run the PickScore protocol with a tiny random
CLIP (rewards.tiny), offline. tests/cli/test_user_errors.py holds what this found, as tests.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPTIONS = ["--benchmark", "--model", "--pretrained", "--checkpoint", "--prompts", "--reward", "--reward-option",
           "--steps", "--guidance", "--resolution", "--seed", "--images-per-prompt", "--samples-per-prompt",
           "--batch-size", "--limit", "--threads", "--device", "--out", "--save-images", "--output"]
BAD = ["", "x", "-1", "0", "nan", "inf", "1e30", "../x", "/abs/path", "[1]", "{a: 1}", "true", "=", "a=b=c"]


def run(option: str, value: str, work: Path, clip: Path) -> dict:
    base = [] if option in ("--limit", "--steps") else ["--limit", "1", "--steps", "1"]
    if option in ("--images-per-prompt", "--out"):
        base += ["--benchmark", "pickscore", "--reward-option", f"pretrained={clip}", "--reward-option", f"processor={clip}"]
    value = value.replace("/abs/path", str(work / "abs" / "path"))  # an absolute path, inside the work folder
    command = [sys.executable, "-m", "flowgrpo.cli", "eval", *base, option, value]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=work, env=env)
    except subprocess.TimeoutExpired:
        return {"option": option, "value": value, "outcome": "timeout"}
    lines = [line for line in done.stderr.splitlines() if line.strip() and "%|" not in line]
    traceback = "Traceback" in done.stderr or done.returncode not in (0, 2)
    outcome = "traceback" if traceback else {0: "ran", 2: "refused"}[done.returncode]
    return {"option": option, "value": value, "outcome": outcome, "last_line": lines[-1][:240] if lines else ""}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    from rewards.tiny import tiny_clip_folder

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        clip = tiny_clip_folder(work / "clip")
        cases = [(o, v) for o in OPTIONS for v in BAD]
        counts: dict[str, int] = {}
        with ThreadPoolExecutor(args.jobs) as pool:
            for row in pool.map(lambda case: run(*case, work, clip), cases):
                counts[row["outcome"]] = counts.get(row["outcome"], 0) + 1
                print(json.dumps(row), flush=True)
    print(json.dumps({"options": len(OPTIONS), "values": len(BAD), **counts}))
    return 1 if counts.get("traceback") or counts.get("timeout") else 0


if __name__ == "__main__":
    sys.exit(main())
