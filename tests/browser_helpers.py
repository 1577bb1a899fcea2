"""A real browser for tests of the HTML report: Debian's headless Chromium, network off.

``browser`` is a module-scoped fixture (conftest makes it every test's);
``load_page`` opens a file in it and ``page_requests`` lists the URLs the page
asked for since.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.fail("chromium and chromium-driver are missing: run scripts/setup.sh (it installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1440,1000",
        "--host-resolver-rules=MAP * ~NOTFOUND",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd(
        "Network.emulateNetworkConditions",
        {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
    )
    yield driver
    driver.quit()


def load_page(driver, report: Path) -> None:
    driver.get_log("performance")  # drop what earlier pages logged
    driver.get_log("browser")
    driver.get(report.as_uri())
    driver.execute_script("return document.readyState")


def page_requests(driver) -> list[str]:
    urls = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            urls.append(msg["params"]["request"]["url"])
    return urls
