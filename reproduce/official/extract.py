"""Write reproduce/official/data/<preset>.yaml from the official repositories' checkouts.

    python reproduce/official/extract.py                  every code base whose checkout variable is set (and
                                                          papers, which needs none)
    python reproduce/official/extract.py flow_grpo dgpo   those code bases (reproduce/official/<code>.py)
    python reproduce/official/extract.py --list           the code bases, their variables and presets
    python reproduce/official/extract.py --any-commit X   code base X from a checkout at another commit than the
                                                          data's (re-reading a newer commit on purpose)

Each code base's module names its repository, the environment variable with the path of its checkout (a git
checkout, or a folder whose COMMIT file names the commit of each file: reproduce/README.md), the presets that
follow its code and ``launches(checkout, preset)``: every official launch of that preset, each value read from the
checkout with its source. ml_collections configs are executed (``pip install -e ".[official]"``); nothing else of the
checkout runs. A value the readers cannot find fails the extraction with the file and pattern. ``papers``
(reproduce/official/papers.py) reads no checkout (its ``ENV`` is None): the presets whose code could not be read
take the runs their papers state, written there as tables, its ``source(preset)`` standing in for the checkout.

A checkout at another commit than the one the data were read at is refused in one line naming that commit
(``Checkout.from_env``); ``--any-commit`` (which sets OFFICIAL_ANY_COMMIT=1) reads it all the same, to move the data to
a newer commit on purpose.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from official import ANY_COMMIT, Checkout, ExtractionError, write_data  # noqa: E402

CODES = ("flow_grpo", "diffusion_nft", "awm", "dgpo", "dancegrpo", "mixgrpo", "branchgrpo", "sage", "unirl", "papers",
         "flow_factory", "visualgrpo")


def module(code: str):
    return importlib.import_module(f"official.{code}")


def extract(code: str) -> list[Path]:
    mod = module(code)
    # a code base with no checkout (ENV None: official/papers.py) gives each preset's source itself
    checkout = Checkout.from_env(mod.REPOSITORY, mod.ENV) if mod.ENV else None
    written = []
    for preset in mod.PRESETS:
        source = checkout if checkout is not None else mod.source(preset)
        launches = mod.launches(source, preset)
        if not launches:
            raise ExtractionError(f"{code}: no launches for {preset}")
        written.append(write_data(preset, source, launches, getattr(mod, "NOTES", {}).get(preset, "")))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("codes", nargs="*", choices=[*CODES, []], help="code bases (default: every one whose checkout is set)")
    parser.add_argument("--list", action="store_true", help="list the code bases, their variables and presets")
    parser.add_argument("--any-commit", action="store_true",
                        help="read a checkout at another commit than the data's (re-reading a newer commit)")
    args = parser.parse_args(argv)
    if args.any_commit:
        os.environ[ANY_COMMIT] = "1"  # every checkout read from here on, a code base's second one included
    if args.list:
        for code in CODES:
            mod = module(code)
            state = f"{mod.ENV}={os.environ.get(mod.ENV, '(not set)')}" if mod.ENV else "(no checkout)"
            print(f"{code:14s} {mod.REPOSITORY:36s} {state}  presets: {', '.join(mod.PRESETS)}")
        return 0
    # by default every code base whose checkout is set, and those that need none (their tables are here)
    codes = args.codes or [c for c in CODES if not module(c).ENV or os.environ.get(module(c).ENV)]
    if not codes:
        print("no checkout is set; see --list for the variables", file=sys.stderr)
        return 2
    status = 0
    for code in codes:
        try:
            for path in extract(code):
                print(f"{code}: wrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
        except ExtractionError as exc:
            print(f"{code}: {exc}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
