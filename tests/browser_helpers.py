"""The browser for the gallery tests: installs Debian's chromium when missing (as root, with apt-get,
as CI runs), else skips with the install command; the driver itself is gallery.browser's."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile

import pytest

from gallery import browser as gb


def ensure_chromium() -> None:
    if gb.chromium_installed():
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip(f"the gallery's browser tests need Debian's chromium: {gb.INSTALL}")
    # one installer at a time (pytest-xdist workers share the machine); the others wait, then find it
    with open(os.path.join(tempfile.gettempdir(), "flowgrpo-chromium-install.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not gb.chromium_installed():
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            try:
                subprocess.run(["apt-get", "update", "-qq"], env=env, timeout=300, check=True, capture_output=True)
                subprocess.run(["apt-get", "install", "-y", "-qq", "chromium", "chromium-driver"], env=env,
                               timeout=600, check=True, capture_output=True)
            except (subprocess.SubprocessError, OSError) as e:
                pytest.skip(f"could not install chromium ({e}); install it with: {gb.INSTALL}")
    if not gb.chromium_installed():
        pytest.skip(f"chromium is still missing; install it with: {gb.INSTALL}")


def start_browser(download_dir):
    ensure_chromium()
    pytest.importorskip("selenium", reason="pip install selenium (the test extra)")
    return gb.start_browser(download_dir)


stop_browser, wait_for, wait_render = gb.stop_browser, gb.wait_for, gb.wait_render


def severe_console_entries(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
