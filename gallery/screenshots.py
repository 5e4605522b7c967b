"""Screenshots of the gallery's main views (docs/screenshots/gallery_*.png), taken in headless chromium.

    python -m gallery.screenshots runs/NAME docs/screenshots [--flag 3]

Builds the site into a temporary folder (the run directory is only read), opens it from disk,
flags a few samples (static mode: the flags stay in that throw-away browser profile) and saves one
PNG per view. Needs Debian's chromium (gallery/browser.py).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from gallery.browser import start_browser, stop_browser, wait_for, wait_render
from gallery.build import build_site

# (file name, URL hash, window height): the views a reviewer uses, in the order docs/gallery.md shows them
VIEWS = [
    ("gallery_samples.png", "", 1000),
    ("gallery_sorted.png", "step=*&layout=samples&sort=reward-desc", 1000),
    ("gallery_compare.png", "view=compare", 1000),  # opens on the prompt sampled in most steps
    ("gallery_charts.png", "view=charts", 1500),
    ("gallery_review.png", "view=review", 800),
]


def take(run_dir, out_dir, flags: int = 3, width: int = 1400) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        index = build_site(run_dir, Path(tmp) / "site")
        driver = start_browser(width=width, height=1000)
        try:
            driver.get(index.as_uri())
            wait_render(driver)
            for k, label in zip(range(flags), ["reward hacked", "good", "bad"]):  # something for the review view
                tiles = driver.find_elements("css selector", "#app .tile")
                n = len(driver.find_elements("css selector", ".tile.flagged"))
                tiles[min(len(tiles) - 1, 3 * k + 1)].find_element("css selector", f"button.flag[data-label='{label}']").click()
                wait_for(driver, f"document.querySelectorAll('.tile.flagged').length > {n}")
            saved = []
            for name, state, height in VIEWS:
                driver.set_window_size(width, height)
                driver.get("about:blank")
                driver.get(index.as_uri() + "#" + state)
                wait_render(driver)
                wait_for(driver, "Array.from(document.images).filter(i => i.getBoundingClientRect().top < innerHeight)"
                                 ".every(i => i.complete)")
                driver.save_screenshot(str(out_dir / name))
                saved.append(out_dir / name)
            return saved
        finally:
            stop_browser(driver)


def main() -> None:
    parser = argparse.ArgumentParser(description="Screenshots of the gallery's main views.")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--flag", type=int, default=3, help="samples to flag first (for the review view)")
    parser.add_argument("--width", type=int, default=1400)
    args = parser.parse_args()
    for path in take(args.run_dir, args.out_dir, args.flag, args.width):
        print(path)


if __name__ == "__main__":
    main()
