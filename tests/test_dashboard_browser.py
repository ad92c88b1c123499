"""The dashboard in a real browser: Debian's chromium (``apt-get install chromium``) driven by
Playwright, nothing downloaded at run time. Without chromium these tests skip, saying why, except
under ``CI=true``, where a missing browser is a failure."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dashboard_helpers import drill_cluster, holder_of, poll, served, state
from local_helpers import home, hotswap  # noqa: F401 (home: a fixture)

CHROMIUM = os.environ.get("HOTSWAP_CHROMIUM", "/usr/bin/chromium")
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
               "--disable-component-update", "--disable-sync"]
SCREENSHOT = os.environ.get("HOTSWAP_DASHBOARD_SCREENSHOT")  # where to save the drill's screenshot (the README's)

pytestmark = pytest.mark.browser


def _missing() -> str | None:
    import importlib.util

    for module, package in (("playwright", "playwright"), ("starlette", "hotswap[dashboard]"), ("uvicorn", "hotswap[dashboard]")):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed (pip install '{package}')"
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)) and not shutil.which(CHROMIUM):
        return f"no chromium at {CHROMIUM} (apt-get install chromium)"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    missing = _missing()
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"browser tests need a browser under CI: {missing}")
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        yield launched
        launched.close()



def open_page(browser: Any, url: str, width: int) -> tuple[Any, list[str]]:
    page = browser.new_page(viewport={"width": width, "height": 900})
    problems: list[str] = []
    page.on("console", lambda message: problems.append(f"console {message.type}: {message.text}") if message.type in ("error", "warning") else None)
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on("requestfailed", lambda request: problems.append(f"request failed: {request.url}") if "/api/stream" not in request.url else None)
    page.goto(url)
    return page, problems


# Each axis label of a chart as the page shows it: its text, whether the label's own box cuts it,
# whether its text lies inside the chart and clear of the plot (left of it, or below it).
AXIS_LABELS = """(chart) => {
  const box = document.querySelector(chart).getBoundingClientRect();
  const plot = document.querySelector(chart + " .u-over").getBoundingClientRect();
  return [...document.querySelectorAll(chart + " .axis-label")].map((label) => {
    const range = document.createRange();
    range.selectNodeContents(label);
    const text = range.getBoundingClientRect();
    const y = label.classList.contains("y");
    return {axis: y ? "y" : "x", text: label.textContent, left: text.left, right: text.right,
            cut: label.scrollWidth > label.clientWidth || label.scrollHeight > label.clientHeight + 1,
            inside: text.left >= box.left - 0.5 && text.right <= box.right + 0.5 && text.width > 0,
            clear: y ? text.right <= plot.left : text.top >= plot.bottom};
  });
}"""

# Every element of a selector whose content is wider than its box (cut, or scrolled out of sight).
CLIPPED = """(selector) => [...document.querySelectorAll(selector)]
  .filter((node) => node.scrollWidth > node.clientWidth + 1).map((node) => node.textContent)"""


def check_axis_labels(page: Any, steps: list[list[float]]) -> None:
    """The charts' labels are whole: the step chart's y labels are whole numbers (with
    thousands separators) within the data's range, every label is inside its chart, none cut,
    and the time labels do not overlap."""
    width = page.viewport_size["width"]
    for chart, pattern in (("#steps-chart", r"\d{1,3}(,\d{3})*"), ("#goodput-chart", r"\d{1,3}%")):
        labels = page.evaluate(AXIS_LABELS, chart)
        ys = [label for label in labels if label["axis"] == "y"]
        xs = sorted((label for label in labels if label["axis"] == "x"), key=lambda label: label["left"])
        assert len(ys) >= 2 and xs, (width, chart, labels)
        for label in labels:
            assert not label["cut"] and label["inside"] and label["clear"], (width, chart, label)
        for label in ys:
            assert re.fullmatch(pattern, label["text"]), (width, chart, label["text"])
        for label in xs:
            assert re.fullmatch(r"\d\d:\d\d:\d\d", label["text"]), (width, chart, label["text"])  # UTC, as the timeline
        assert all(a["right"] < b["left"] for a, b in zip(xs, xs[1:])), (width, chart, xs)
        if chart == "#steps-chart":
            values = sorted(int(label["text"].replace(",", "")) for label in ys)
            step = values[1] - values[0]
            low, high = min(s for _, s in steps), max(s for _, s in steps)
            # 15,000 reads "15,000", not "5,000": the labels lie within the data's range.
            assert low - step <= values[0] and values[-1] <= high + step, (width, values, low, high)
            assert values[-1] >= 10_000, (width, values)
        else:
            assert all(0 <= int(label["text"][:-1]) <= 100 for label in ys), (width, ys)


def test_a_hotswap_drill_in_the_browser_at_1280_and_390_pixels(browser: Any, home: Path, tmp_path: Path) -> None:
    drill_cluster(home, tmp_path, first_step=14_990)  # steps past 15,000: five digits on the y axis
    with served(home) as board:
        document = poll(board, lambda d: any(w["step"] for w in d["workloads"]), "a step of high")
        (old_slice,) = holder_of(document, "high")
        wide, wide_problems = open_page(browser, board.url, 1280)
        narrow, narrow_problems = open_page(browser, board.url, 390)
        for page in (wide, narrow):
            page.wait_for_selector(f"[data-slice='{old_slice}'][data-holder='high']", timeout=30_000)
            page.wait_for_selector("#status.live", timeout=30_000)
            # The queued workload, with why it waits.
            reason = page.text_content("[data-queued='waiter'] td.reason", timeout=30_000)
            assert reason and reason.startswith("queued")
            assert page.locator("#steps-chart canvas").count() >= 1 and page.locator("#goodput-chart canvas").count() >= 1

        hotswap(home, "node", "fail", "--cluster", "c", "--slice", old_slice, check=True)
        committed = time.monotonic()
        # The bar: the moved workload is on its new slice on the page within 2 s.
        wide.wait_for_selector(f"[data-holder='high']:not([data-slice='{old_slice}'])", timeout=2_000)
        seen_after_s = time.monotonic() - committed
        narrow.wait_for_selector(f"[data-holder='high']:not([data-slice='{old_slice}'])", timeout=2_000)
        wide.wait_for_selector(f"[data-slice='{old_slice}'].unhealthy", timeout=10_000)
        wide.wait_for_selector("#events li.cat-failure", timeout=10_000)
        if SCREENSHOT:
            poll(board, lambda d: any(w["mttr_s"] for w in d["workloads"]), "high's recovery")
            wide.wait_for_timeout(1500)
            wide.screenshot(path=SCREENSHOT, full_page=True)

        document = poll(board, lambda d: any(w["mttr_s"] for w in d["workloads"]), "high's recovery")
        for page in (wide, narrow):
            width = page.viewport_size["width"]
            assert page.evaluate("document.documentElement.scrollWidth") <= width, f"the page overflows {width} px"
            assert page.locator("[data-workload='high']").is_visible()
            page.wait_for_selector("[data-workload='waiter'] td.badput div", timeout=10_000)
            # Restarts as kubectl counts them (the hotswap is one), the charged ones beside them.
            assert page.text_content("[data-workload='high'] td.restarts") == "1 (0 charged)"
            check_axis_labels(page, state(board)["steps"]["high"])
            assert page.evaluate(CLIPPED, "td.badput") == [], f"a Badput cell is cut at {width} px"
        # At 1280 px the whole workloads table is seen, its Badput column included.
        assert wide.evaluate(CLIPPED, "#workloads-section .scroll") == [], "the workloads table is cut at 1280 px"
        print("badput shown:", [w["badput"] for w in document["workloads"]])
        assert wide_problems == [] and narrow_problems == [], wide_problems + narrow_problems
        print(f"high shown on its new slice {seen_after_s:.2f} s after the node failure was committed")

        board.stop()  # the dashboard's server is gone: the page says its data is stale, not blank
        wide.wait_for_selector("#status.error", timeout=15_000)
        assert "stale" in (wide.text_content("#status") or "")
        assert wide.locator("[data-workload='high']").is_visible()
