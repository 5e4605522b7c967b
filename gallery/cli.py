"""The gallery command: ``python -m gallery RUN_DIR`` or ``flowgrpo-gallery RUN_DIR``."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="flowgrpo-gallery",
        description="Build the sample review site of a run directory (and optionally serve it on 127.0.0.1).",
    )
    parser.add_argument("run_dir", type=Path, help="a run directory, e.g. runs/tiny-sd3-toy")
    parser.add_argument("--out", type=Path, default=None, help="site folder (default: RUN_DIR/gallery)")
    parser.add_argument("--serve", action="store_true",
                        help="serve on 127.0.0.1, pick up new steps while training runs, save flags to RUN_DIR/review/")
    parser.add_argument("--port", type=int, default=8000, help="port for --serve (0 = any free port)")
    parser.add_argument("--force", action="store_true", help="re-read every step (ignore the build cache)")
    parser.add_argument("--verbose", action="store_true", help="log every request when serving")
    args = parser.parse_intermixed_args(argv)  # options before or after the run directory
    if not args.run_dir.is_dir():
        parser.error(f"{args.run_dir} is not a directory (expected a run directory such as runs/NAME)")

    if args.serve:  # the server builds first, then rebuilds as the page asks for new steps
        from gallery.serve import serve

        serve(args.run_dir, args.out, port=args.port, verbose=args.verbose, force=args.force)
        return 0
    from gallery.build import build_site, describe

    start = time.perf_counter()
    index = build_site(args.run_dir, args.out, force=args.force)
    print(f"built {index} ({describe(index.parent)}) in {time.perf_counter() - start:.1f} s; "
          f"open it in a browser, or serve it: python -m gallery {args.run_dir} --serve", file=sys.stderr)
    return 0
