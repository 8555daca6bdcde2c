"""The console at 1280x800 in Chromium: the runs, schedules, definitions and workers lists
show every column whole (none clipped, the page does not scroll sideways, the cron text on
one line), and the screenshots of docs/operations.md are taken here.

``CLEAT_UPDATE_DOCS_SCREENSHOTS=1`` copies the screenshots to ``docs/screenshots/``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from schedules import services as schedules
from tests.browser import scenario
from tests.browser.test_console_chromium import PASSWORD, browser, screenshot, wait_for
from workflows.store import workers as registry

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

__all__ = ["browser"]  # the fixture, shared with the operator session's test

SIZE = (1280, 800)

# For each cell and header of the list: whether its content is cut (wider than the cell,
# or beyond the right edge of the window), and whether the page or the list scrolls sideways.
LAYOUT = """
const table = document.querySelector('#result_list');
if (!table) { return {missing: true}; }
const view = document.documentElement.clientWidth;
const clipped = [];
const heads = [...table.querySelectorAll('thead th')].map(th => th.innerText.trim());
for (const row of table.querySelectorAll('tr')) {
  [...row.children].forEach((cell, i) => {
    const box = cell.getBoundingClientRect();
    if (cell.scrollWidth > cell.clientWidth + 1 || box.right > view + 0.5) {
      clipped.push((heads[i] || ('column ' + i)) + ': ' + cell.innerText.trim().slice(0, 40));
    }
  });
}
const wrap = table.closest('.results') || table.parentElement;
return {
  clipped: clipped,
  page_overflow: document.documentElement.scrollWidth - view,
  list_overflow: wrap.scrollWidth - wrap.clientWidth,
  headers: heads,
};
"""


def layout(driver: WebDriver) -> dict[str, Any]:
    found = driver.execute_script(LAYOUT)
    assert isinstance(found, dict) and not found.get("missing"), "no #result_list on the page"
    return found


def assert_no_clipped_column(driver: WebDriver, page: str) -> dict[str, Any]:
    found = layout(driver)
    assert found["clipped"] == [], f"{page}: clipped cells {found['clipped']}"
    assert found["page_overflow"] <= 0, f"{page}: the page scrolls sideways by {found}"
    assert found["list_overflow"] <= 0, f"{page}: the list scrolls sideways by {found}"
    return found


def set_viewport(driver: WebDriver, width: int, height: int) -> None:
    """Size the window so that the page itself (the viewport) is ``width`` x ``height``."""
    driver.set_window_size(width, height)
    inner = driver.execute_script("return [window.innerWidth, window.innerHeight]")
    driver.set_window_size(2 * width - inner[0], 2 * height - inner[1])
    inner = driver.execute_script("return [window.innerWidth, window.innerHeight]")
    assert inner == [width, height], f"the viewport is {inner}, not {width}x{height}"


def schedules_world(tenant: Any) -> None:
    now = timezone.now()
    schedules.create_schedule(
        tenant,
        name="nightly-invoices",
        workflow_name="shop-order",
        cron="30 2 * * 1-5",
        timezone="Europe/Paris",
        input='{"item": "invoice", "amount": 1}',
        now=now - timedelta(days=1),
    )
    hourly = schedules.create_schedule(
        tenant,
        name="hourly-stock-check",
        workflow_name="shop-order",
        cron="0 */1 * * *",
        timezone="America/New_York",
        input='{"item": "stock", "amount": 0}',
    )
    schedules.trigger_schedule(tenant, hourly.pk)


def workers_world() -> None:
    """Two live workers (one on two queues, busy) and one killed an hour ago, its last loop
    error kept."""
    now = registry.fleet_now()
    for worker_id, host, queues, held, rate, age, error in (
        ("app-1-18231-3fa2c1", "app-1", ["default"], 4, 41.5, 3, ""),
        ("app-2-9120-b71e0d", "app-2", ["default", "bulk"], 1, 12.0, 11, ""),
        (
            "batch-1-4411-0c9a7f",
            "batch-1",
            ["bulk"],
            2,
            0.0,
            3600,
            "OperationalError: server closed the connection unexpectedly",
        ),
    ):
        beat_at = now - timedelta(seconds=age)
        registry.record_heartbeat(
            registry.WorkerBeat(
                worker_id=worker_id,
                host=host,
                pid=int(worker_id.split("-")[2]),
                task_queues=queues,
                concurrency=8,
                started_at=now - timedelta(hours=6),
                heartbeat_interval_s=20.0,
                runs_held=held,
                steps_total=int(rate * 21_000) or 310_412,
                steps_per_s=rate,
                last_error=error,
                last_error_at=beat_at if error else None,
            ),
            beat_at,
        )


def test_lists_show_every_column_at_1280_by_800(
    live_server: Any, browser: WebDriver, tenant: Any
) -> None:
    scenario.OUTAGES.clear()
    scenario.populate(tenant)
    schedules_world(tenant)
    workers_world()
    get_user_model().objects.create_superuser("operator", "op@example.com", PASSWORD)
    set_viewport(browser, *SIZE)
    url = live_server.url
    browser.get(f"{url}/admin/login/?next=/admin/")
    browser.find_element(By.NAME, "username").send_keys("operator")
    browser.find_element(By.NAME, "password").send_keys(PASSWORD)
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    # Signed in: the login page has a #content too, and moving on before the login's POST
    # came back left the browser signed out (the run list then redirected to the login).
    wait_for(browser, "#user-tools")

    browser.get(f"{url}/admin/workflows/workflowinstance/")
    wait_for(browser, "#result_list")
    screenshot(browser, "runs", ["#result_list"])
    runs = assert_no_clipped_column(browser, "runs")
    assert {"error code", "created at"} <= {h.lower() for h in runs["headers"]}, runs

    browser.get(f"{url}/admin/schedules/schedule/")
    wait_for(browser, "#result_list")
    screenshot(browser, "schedules", ["#result_list"])
    assert_no_clipped_column(browser, "schedules")
    for cron in browser.find_elements(By.CSS_SELECTOR, "#result_list td.field-cron_column"):
        lines = browser.execute_script(
            "const r = document.createRange(); r.selectNodeContents(arguments[0]);"
            "return new Set([...r.getClientRects()].map(b => Math.round(b.top))).size;",
            cron,
        )
        assert lines == 1, f"the cron {cron.text!r} wraps onto {lines} lines"

    browser.get(f"{url}/admin/workflows/workflowdefinition/")
    wait_for(browser, "#result_list")
    screenshot(browser, "definitions", ["#result_list"])
    assert_no_clipped_column(browser, "definitions")
    sizes = [
        c.text for c in browser.find_elements(By.CSS_SELECTOR, "#result_list td.field-size_column")
    ]
    assert sizes and all(s.endswith(("B", "KiB", "MiB")) for s in sizes), sizes

    browser.get(f"{url}/admin/console/workers/")
    wait_for(browser, "#result_list")
    screenshot(browser, "workers", ["#result_list", "#workers-figures", "#backlog"])
    found = assert_no_clipped_column(browser, "workers")
    headers = {h.lower() for h in found["headers"]}
    assert {"worker", "state", "heartbeat", "steps/s", "last error"} <= headers, found
    stale = browser.find_elements(By.CSS_SELECTOR, "#result_list tr[data-stale='1']")
    assert [row.get_attribute("data-worker") for row in stale] == ["batch-1-4411-0c9a7f"]
