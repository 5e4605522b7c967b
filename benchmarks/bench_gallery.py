"""Gallery speed at scale: build time for a 20,000-sample run and first render in headless chromium.

    python benchmarks/bench_gallery.py [--samples 20000] [--per-step 400] [--loads 3] [--keep DIR]

Synthesises a run directory (gallery.synthetic: 64x64 PNGs, 4 samples per prompt, --per-step
samples per step, metrics for every iteration), then prints
- the cold build (every manifest read, every file linked) and a no-change rebuild, in seconds;
- first render, in ms after navigation start, of the default view (latest step, 20 prompt groups)
  opened from disk (file://) and from the local server, best of --loads fresh page loads, with the
  time at which the images in the first screen have all loaded;
- the "all steps" view (every shard loaded, 20,000 samples filtered and sorted) for scale.
Targets (issue 8): build < 60 s, first page < 2 s. Needs Debian's chromium (gallery/browser.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gallery import build_site  # noqa: E402
from gallery.browser import start_browser, stop_browser, wait_for, wait_render  # noqa: E402
from gallery.serve import GalleryServer  # noqa: E402
from gallery.synthetic import write_run  # noqa: E402

VISIBLE_IMAGES = ("Array.from(document.querySelectorAll('.tile img'))"
                  ".filter(i => i.getBoundingClientRect().top < innerHeight)")


def page_load(driver, url: str) -> tuple[float, float]:
    """(first render, first-screen images loaded), ms after navigation start, for one fresh load."""
    driver.get("about:blank")
    driver.get(url)
    wait_render(driver, timeout=60)
    first = driver.execute_script("return window.__gallery.firstRender")
    images = wait_for(driver, f"(imgs => imgs.length > 0 && imgs.every(i => i.complete) && performance.now())({VISIBLE_IMAGES})", 60)
    return first, images


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--per-step", type=int, default=400, help="samples per step (4 per prompt)")
    parser.add_argument("--loads", type=int, default=3, help="page loads per measurement (best is printed)")
    parser.add_argument("--keep", type=Path, default=None, help="write the run here and keep it")
    args = parser.parse_args()

    tmp = tempfile.TemporaryDirectory()
    run = (args.keep or Path(tmp.name)) / "bench-run"
    steps = args.samples // args.per_step
    t = time.perf_counter()
    write_run(run, steps=steps, prompts_per_step=args.per_step // 4, per_prompt=4, distinct_images=400)
    print(f"synthesised {steps} steps x {args.per_step} samples = {steps * args.per_step} samples "
          f"(64x64 PNGs) in {time.perf_counter() - t:.1f} s")

    t = time.perf_counter()
    index = build_site(run, force=True)
    print(f"build, cold:       {time.perf_counter() - t:6.2f} s   (target < 60 s)")
    t = time.perf_counter()
    build_site(run)
    print(f"rebuild, no change:{time.perf_counter() - t:6.2f} s")
    size = sum(p.stat().st_size for p in (index.parent / "data").rglob("*.js"))
    print(f"data shards: {size / 1e6:.1f} MB in {len(list((index.parent / 'data' / 'steps').glob('*.js')))} files")

    driver = start_browser(width=1280, height=900)
    server = GalleryServer(run, index.parent, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        page_load(driver, index.as_uri())  # warm the browser's own start-up once
        for name, url in [("file://", index.as_uri()), ("served", server.url)]:
            loads = [page_load(driver, url) for _ in range(args.loads)]
            first = [f for f, _ in loads]
            images = [i for _, i in loads]
            print(f"first render, {name:8s} best {min(first):6.0f} ms, median {statistics.median(first):6.0f} ms; "
                  f"first-screen images loaded: best {min(images):6.0f} ms   (target < 2000 ms)")
        driver.get("about:blank")
        driver.get(index.as_uri() + "#step=*&layout=samples&sort=reward-desc")
        wait_render(driver, timeout=120)
        tiles = driver.execute_script("return document.querySelectorAll('.tile').length")
        total = driver.execute_script("return document.querySelector('.summary').textContent")
        print(f"all steps, sorted by reward: {driver.execute_script('return window.__gallery.firstRender'):.0f} ms "
              f"({total}; {tiles} on the first page)")
    finally:
        server.shutdown()
        server.server_close()
        stop_browser(driver)
        tmp.cleanup()


if __name__ == "__main__":
    main()
