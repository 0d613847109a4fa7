"""Headless Chromium for the dashboard tests: Debian's ``chromium`` (``ci/ensure-chromium.sh`` installs it
for ``make test``) driven by Playwright's Python package; Playwright's own browser downloads are not used.

``browser`` is a module-scoped fixture (import it into a test module or conftest); :func:`open_page` opens
a page that records every console error or warning, page error and failed request in ``problems``, so a
test can assert the page ran clean."""

import os

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser():
    """One Chromium per test module; skips, saying why, without chromium or playwright."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"Debian's chromium is not installed at {CHROMIUM} (ci/ensure-chromium.sh installs it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the test extra's playwright is not installed")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def open_page(browser, url, problems, credentials=None, height=900, failed_requests=True):
    """A new context and page at ``url`` (loaded), as ``(context, page)``. Console errors and warnings,
    page errors and (with ``failed_requests``) failed requests other than the event stream's, which a
    closing page cuts, are appended to ``problems``."""
    ctx = browser.new_context(http_credentials=credentials, viewport={"width": 1280, "height": height})
    page = ctx.new_page()
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
            if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    if failed_requests:
        page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url} {r.failure}")
                if not r.url.endswith("/api/events") else None)
    page.goto(url, wait_until="load")
    return ctx, page
