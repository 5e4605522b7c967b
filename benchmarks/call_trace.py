"""How control moves between the project's files while training runs: a count of calls that cross files and
of calls that come back into a file still waiting lower on the call stack (A calls B, which calls A again).

    python benchmarks/call_trace.py                      # the image default, one iteration, from train_t2i.py's main
    python benchmarks/call_trace.py --preset flow_grpo
    python benchmarks/call_trace.py --config configs/analytic.yaml

It runs ``train_t2i.main`` in process (``train.iterations`` set by ``--iterations``, evaluation, samples,
checkpoints and the gallery off) under ``sys.setprofile`` and keeps, for every call of a function defined in
a file of this repository (the main thread; torch, diffusers and the rest are not followed), the file it is
in. It prints:

- crossings: calls into a function of another file than the caller's (repository files only);
- comebacks: calls into a file that is already on the call stack below the caller, i.e. control going back
  into a file it left without returning (the trainer calling a learner that calls the trainer again);
- the distinct comeback chains, with their counts (``a.py > b.py > a.py``).

Nothing of the project is imported by name, so the same command measures any checkout with a
``train_t2i.py`` entry point: run it in each and compare.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset")
    parser.add_argument("--config")
    parser.add_argument("--iterations", type=int, default=1)
    parser.add_argument("--top", type=int, default=12, help="comeback chains listed")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)
    import train_t2i

    prefix = str(ROOT) + os.sep
    venv = str(ROOT / ".venv")
    stack: list[str] = []  # repository file of every frame on the stack ("" for frames outside it)
    crossings, comebacks = 0, collections.Counter()

    def profile(frame, event, arg):
        nonlocal crossings
        if event == "call":
            name = frame.f_code.co_filename
            mine = name.startswith(prefix) and not name.startswith(venv) and "benchmarks" not in name
            here = os.path.relpath(name, ROOT) if mine else ""
            if here:
                below = [f for f in stack if f]
                if below and below[-1] != here:
                    crossings += 1
                    if here in below:
                        start = len(below) - 1 - below[::-1].index(here)
                        chain = [below[start]]
                        for f in below[start + 1:]:
                            if f != chain[-1]:
                                chain.append(f)
                        comebacks[" > ".join(chain + [here])] += 1
            stack.append(here)
        elif event == "return" and stack:
            stack.pop()

    extra = ["--preset", args.preset] if args.preset else []
    extra += ["--config", args.config] if args.config else []
    with tempfile.TemporaryDirectory() as out:
        argv = [*extra, f"output_dir={out}", f"train.iterations={args.iterations}", "eval.at_start=false", "eval.every=0",
                "eval.limit=1", "eval.batch_size=1", "log.samples_every=0", "log.eval_samples=0", "log.save_every=0",
                "log.progress=false", "log.gallery=false", "log.tensorboard=false", "threads=1", *args.overrides]
        sys.setprofile(profile)
        try:
            code = train_t2i.main(argv)
        finally:
            sys.setprofile(None)
    print(f"train_t2i.py {' '.join(argv)}: exit {code}")
    print(f"calls crossing files: {crossings}")
    print(f"comebacks (a call into a file already on the stack below its caller): {sum(comebacks.values())} "
          f"in {len(comebacks)} chains")
    for chain, n in comebacks.most_common(args.top):
        print(f"  {n:6d}  {chain}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
