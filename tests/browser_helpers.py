"""A real headless browser for the gallery tests: Debian's chromium driven through chromedriver.

The fixture installs chromium + chromium-driver with apt-get when they are missing and the tests run
as root (CI does); otherwise the browser tests skip with the install command. Selenium is pointed
at /usr/bin/chromedriver explicitly, so Selenium Manager never downloads a browser or a driver.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
INSTALL = "apt-get update && apt-get install -y chromium chromium-driver"


def ensure_chromium() -> None:
    if os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip(f"the gallery's browser tests need Debian's chromium: {INSTALL}")
    # one installer at a time (pytest-xdist workers share the machine); the others wait, then find it
    with open(os.path.join(tempfile.gettempdir(), "flowgrpo-chromium-install.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            try:
                subprocess.run(["apt-get", "update", "-qq"], env=env, timeout=300, check=True, capture_output=True)
                subprocess.run(["apt-get", "install", "-y", "-qq", "chromium", "chromium-driver"], env=env,
                               timeout=600, check=True, capture_output=True)
            except (subprocess.SubprocessError, OSError) as e:
                pytest.skip(f"could not install chromium ({e}); install it with: {INSTALL}")
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.skip(f"chromium is still missing; install it with: {INSTALL}")


def start_browser(download_dir: Path, width: int = 1280, height: int = 900):
    """A headless chromium (Selenium WebDriver) that logs console messages and downloads to download_dir."""
    ensure_chromium()
    webdriver = pytest.importorskip("selenium.webdriver", reason="pip install selenium (the test extra)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="flowgrpo-chromium-")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 "--autoplay-policy=no-user-gesture-required", f"--user-data-dir={profile}",
                 f"--window-size={width},{height}", "--hide-scrollbars"):
        options.add_argument(flag)
    options.add_experimental_option("prefs", {"download.default_directory": str(download_dir),
                                              "download.prompt_for_download": False})
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(download_dir)})
    driver._flowgrpo_profile, driver._flowgrpo_downloads = profile, Path(download_dir)
    return driver


def stop_browser(driver) -> None:
    driver.quit()
    shutil.rmtree(driver._flowgrpo_profile, ignore_errors=True)


def wait_for(driver, script: str, timeout: float = 10.0):
    """Poll a JavaScript expression until it is truthy; returns its value."""
    deadline = time.monotonic() + timeout
    while True:
        value = driver.execute_script("return " + script)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for: {script}")
        time.sleep(0.05)


def wait_render(driver, after: int = 0, timeout: float = 10.0) -> int:
    """Wait until the gallery has finished more than ``after`` renders; returns the render count."""
    return wait_for(driver, f"window.__gallery && document.getElementById('app').dataset.state === 'ready' "
                            f"&& window.__gallery.renders > {after} && window.__gallery.renders", timeout)


def severe_console_entries(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
