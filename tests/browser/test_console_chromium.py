"""The operator console in a real browser: Debian's Chromium, headless, driven by Selenium
against pytest-django's live server.

One operator session: log in, find a dead-lettered run by searching for its error, retry it
through the confirmation page, run the worker (the real ``runworker --burst`` command,
in-process), see the run done and open its timeline; force-fail another run with a reason and
find the audit entry; upload an invalid module and read wasmtime's reason on the form. Along
the way it takes screenshots of the dashboard, a timeline and the dead-letter queue into
``test-artifacts/screenshots/`` and checks them (a real PNG of the window's size, and the
elements the page is about present in the DOM). ``CLEAT_UPDATE_DOCS_SCREENSHOTS=1`` also
copies them to ``docs/screenshots/`` for docs/operations.md.

Chromium runs with a fresh profile and no network beyond the loopback live server.
"""

from __future__ import annotations

import io
import os
import shutil
import struct
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from selenium import webdriver
from selenium.webdriver.chrome.service import Service as ChromeService
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import Select, WebDriverWait

from engine.services import Services
from tests.browser import scenario
from workflows.executor import set_services
from workflows.models import AuditLog, WorkflowDefinition, WorkflowInstance
from workflows.tenancy import tenant_context

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
DOCS_SCREENSHOTS = ROOT / "docs" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WINDOW = (1280, 1400)
PASSWORD = "console-pw-9876"


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    assert not missing, (
        f"{', '.join(missing)} missing: install Debian's chromium and chromium-driver "
        "(python3 dev.py test does: apt-get install -y chromium chromium-driver)"
    )
    profile = tempfile.mkdtemp(prefix="cleat-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=ChromeService(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_for(driver: WebDriver, css: str, timeout: float = 30) -> Any:
    return WebDriverWait(driver, timeout).until(
        expected_conditions.presence_of_element_located((By.CSS_SELECTOR, css))
    )


def messages(driver: WebDriver) -> str:
    return " | ".join(e.text for e in driver.find_elements(By.CSS_SELECTOR, "ul.messagelist li"))


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def screenshot(driver: WebDriver, name: str, must_show: list[str]) -> Path:
    """Save the window as ``name``.png, then check the file and the page it shows."""
    for css in must_show:
        assert driver.find_elements(By.CSS_SELECTOR, css), f"{name}: no {css} on the page"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    path.unlink(missing_ok=True)
    assert driver.save_screenshot(str(path)), f"chromium did not write {path}"
    width, height = png_size(path)
    viewport = driver.execute_script(
        "return [Math.round(window.innerWidth * window.devicePixelRatio),"
        " Math.round(window.innerHeight * window.devicePixelRatio)]"
    )
    assert [width, height] == viewport, f"{path}: {width}x{height}, the window is {viewport}"
    assert width >= 1000 and height >= 800, f"{path}: {width}x{height} is too small"
    assert path.stat().st_size > 20_000, f"{path} is suspiciously small (a blank page?)"
    if os.environ.get("CLEAT_UPDATE_DOCS_SCREENSHOTS") == "1":
        DOCS_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, DOCS_SCREENSHOTS / path.name)
    return path


def run_worker_until(done: Callable[[], bool], limit_s: float = 20) -> None:
    """``manage.py runworker --burst``, in-process, until ``done()`` (the shop workflow
    sleeps 500 ms between its calls, so a run needs a second pass)."""
    set_services(Services.from_settings(scenario.SERVICES))
    try:
        deadline = time.monotonic() + limit_s
        while not done():
            assert time.monotonic() < deadline, f"the worker did not finish in {limit_s} s"
            call_command("runworker", "--burst", stdout=io.StringIO())
            time.sleep(0.1)
    finally:
        set_services(None)


def status_of(tenant: Any, run_id: str) -> str:
    with tenant_context(tenant.id):
        return WorkflowInstance.objects.get(id=run_id).status


def test_operator_session_in_chromium(live_server: Any, browser: WebDriver, tenant: Any) -> None:
    scenario.OUTAGES.clear()
    runs = scenario.populate(tenant)
    get_user_model().objects.create_superuser("operator", "op@example.com", PASSWORD)
    url = live_server.url

    # Log in.
    browser.get(f"{url}/admin/login/?next=/admin/console/dashboard/")
    browser.find_element(By.NAME, "username").send_keys("operator")
    browser.find_element(By.NAME, "password").send_keys(PASSWORD)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait_for(browser, "#dashboard")

    # The dashboard: figures and charts drawn server-side.
    assert browser.find_element(By.ID, "fig-total").text == "10"
    assert len(browser.find_elements(By.CSS_SELECTOR, "#dashboard svg.chart")) >= 4
    assert browser.find_elements(By.CSS_SELECTOR, "svg.chart-per-minute rect.chart-column")
    screenshot(
        browser,
        "dashboard",
        ["#dashboard-figures", "svg.chart-bars", "svg.chart-per-minute", "svg.chart-stacked"],
    )

    # The dead-letter queue, grouped by definition and error code.
    browser.find_element(By.LINK_TEXT, "Dead letters").click()
    wait_for(browser, "#dead-letters")
    groups = browser.find_elements(By.CSS_SELECTOR, ".cleat-dlq-group")
    assert {(g.get_attribute("data-definition"), g.get_attribute("data-code")) for g in groups} == {
        ("shop-order", "error"),
        ("invoice-order", "nondeterminism"),
    }
    screenshot(browser, "dead-letter-queue", [".cleat-dlq-group", "input.dlq-retry"])

    # Find a dead-lettered run by searching for its error, and retry it.
    target = runs["broken"][0]
    browser.get(f"{url}/admin/workflows/workflowinstance/")
    search = browser.find_element(By.ID, "searchbar")
    search.send_keys("reservx")  # the replay error names the call the new code asked for
    search.submit()
    wait_for(browser, "#result_list")
    found = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(found) == 2, [r.text for r in found]
    assert all("dead-lettered" in row.text for row in found)
    browser.find_element(By.CSS_SELECTOR, f'#result_list code[title="{target}"]').click()
    wait_for(browser, "#instance")
    assert browser.find_element(By.ID, "instance").get_attribute("data-status") == "dead_lettered"
    browser.find_element(By.ID, "action-retry").click()
    wait_for(browser, "#action-form")
    assert target in browser.find_element(By.ID, "confirm-runs").text
    browser.find_element(By.NAME, "reason").send_keys("bad deploy rolled back")
    browser.find_element(By.ID, "confirm-action").click()
    wait_for(browser, "#instance")
    assert "retried" in messages(browser)
    assert status_of(tenant, target) == "ready"

    # The worker runs it to completion; the page shows it done, with its timeline.
    run_worker_until(lambda: status_of(tenant, target) == "done")
    browser.refresh()
    wait_for(browser, "#instance")
    assert browser.find_element(By.ID, "instance").get_attribute("data-status") == "done"
    timeline = browser.find_element(By.CSS_SELECTOR, "svg.cleat-timeline")
    items = timeline.find_elements(By.CSS_SELECTOR, "g.tl-item")
    kinds = {i.get_attribute("data-type") for i in items}
    assert {"call", "sleep", "admin_action"} <= kinds, kinds
    assert timeline.find_elements(By.CSS_SELECTOR, "g.tl-end-done")
    assert "charged" in browser.find_element(By.ID, "run-query-state").text
    browser.execute_script("document.getElementById('timeline').scrollIntoView()")
    screenshot(browser, "instance-timeline", ["svg.cleat-timeline g.tl-call", "#event-table"])

    # Force-fail a waiting run, with a reason; the audit entry shows on its page.
    victim = runs["waiting"][0]
    browser.get(f"{url}/admin/workflows/workflowinstance/{victim}/change/")
    wait_for(browser, "#instance")
    browser.find_element(By.ID, "action-force_fail").click()
    wait_for(browser, "#action-form")
    browser.find_element(By.NAME, "message").send_keys("customer never paid")
    Select(browser.find_element(By.NAME, "code")).select_by_value("permanent")
    browser.find_element(By.NAME, "reason").send_keys("order abandoned after 30 days")
    browser.find_element(By.ID, "confirm-action").click()
    wait_for(browser, "#run-audit")
    assert "force-failed" in messages(browser)
    audit = browser.find_element(By.CSS_SELECTOR, "#run-audit tr.audit-force_fail").text
    assert "order abandoned after 30 days" in audit and "admin:operator" in audit
    assert "customer never paid" in browser.find_element(By.ID, "run-error").text
    with tenant_context(tenant.id):
        assert AuditLog.objects.filter(instance_id=victim, action="force_fail").exists()

    # Upload an invalid module: wasmtime's reason on the form, nothing deployed.
    broken = Path(tempfile.mkdtemp(prefix="cleat-upload-")) / "broken.wasm"
    broken.write_bytes(b"\x00asm\x01\x00\x00\x00this is not a module")
    browser.get(f"{url}/admin/workflows/workflowdefinition/add/")
    wait_for(browser, "#deploy-form")
    browser.find_element(By.NAME, "name").send_keys("broken-upload")
    browser.find_element(By.NAME, "wasm").send_keys(str(broken))
    browser.find_element(By.ID, "deploy-submit").click()
    error = wait_for(browser, ".field-wasm ul.errorlist")
    assert error.text.strip(), "the form error is empty"
    with tenant_context(tenant.id):
        assert not WorkflowDefinition.objects.filter(name="broken-upload").exists()
    shutil.rmtree(broken.parent, ignore_errors=True)
