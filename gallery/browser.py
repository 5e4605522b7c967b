"""Headless Debian chromium for the gallery's screenshots, benchmark and tests (Selenium WebDriver).

Needs `apt-get install -y chromium chromium-driver` and selenium (the test extra). Selenium is given
/usr/bin/chromedriver explicitly, so Selenium Manager never downloads a browser or a driver.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
INSTALL = "apt-get update && apt-get install -y chromium chromium-driver"


def chromium_installed() -> bool:
    return os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)


def start_browser(download_dir=None, width: int = 1280, height: int = 900):
    """A headless chromium that keeps console messages (get_log('browser')) and downloads to download_dir."""
    if not chromium_installed():
        raise RuntimeError(f"Debian's chromium and chromedriver are needed: {INSTALL}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="flowgrpo-chromium-")
    downloads = Path(download_dir) if download_dir else Path(profile) / "downloads"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 "--autoplay-policy=no-user-gesture-required", f"--user-data-dir={profile}",
                 f"--window-size={width},{height}", "--hide-scrollbars"):
        options.add_argument(flag)
    options.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                              "download.prompt_for_download": False})
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    driver._flowgrpo_profile, driver._flowgrpo_downloads = profile, downloads
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
            raise TimeoutError(f"timed out after {timeout} s waiting for: {script}")
        time.sleep(0.02)


def wait_render(driver, after: int = 0, timeout: float = 10.0) -> int:
    """Wait until the gallery has finished more than ``after`` renders; returns the render count."""
    return wait_for(driver, f"window.__gallery && document.getElementById('app').dataset.state === 'ready' "
                            f"&& window.__gallery.renders > {after} && window.__gallery.renders", timeout)
