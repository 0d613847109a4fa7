"""The dashboard (``GET /``) in headless Chromium: Debian's ``chromium`` driven by Playwright's Python
package (``ci/ensure-chromium.sh`` installs it for ``make test``; Playwright's own browser downloads are
not used). The page loads without console errors, shows a stream created while it is open, and its
record count rises as records are published through rstream."""

import asyncio
import json
import threading
import uuid

import pytest
from rstream import Producer

from chromium import browser, open_page  # noqa: F401  (browser: a fixture)
from procs import ServerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CREDS = dict(username="guest", password="guest")
TIMEOUT_MS = 15_000


def in_thread(coro_fn, *args):
    """Run ``coro_fn(*args)`` on its own event loop in another thread (Playwright's sync API owns this
    thread's loop) and return its result."""
    out, err = [], []

    def target():
        try:
            out.append(asyncio.run(asyncio.wait_for(coro_fn(*args), 60)))
        except BaseException as e:  # noqa: BLE001 - re-raised below
            err.append(e)
    t = threading.Thread(target=target)
    t.start()
    t.join(90)
    if err:
        raise err[0]
    assert not t.is_alive(), "publishing did not finish"
    return out[0] if out else None


async def create(port, name):
    async with Producer("127.0.0.1", port, **CREDS) as p:
        await p.create_stream(name)


async def publish(port, name, start, n):
    async with Producer("127.0.0.1", port, **CREDS) as p:
        await p.send_batch(name, [json.dumps({"n": i, "kind": "order"}).encode() for i in range(start, start + n - 1)])
        await p.send_wait(name, json.dumps({"n": start + n - 1, "kind": "order"}).encode())


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = ServerProcess(tmp_path_factory.mktemp("dashboard"), "--http-port", "0").start()
    yield s
    assert s.stop() == 0


def open_dashboard(browser, srv, problems):
    return open_page(browser, f"http://127.0.0.1:{srv.ports['http']}/", problems, credentials=CREDS)


def records_cell(page, name):
    return page.locator(f'#streams tbody tr[data-stream="{name}"] td.records')


def test_dashboard_shows_a_new_stream_and_its_count_rising(browser, srv):
    problems = []
    ctx, page = open_dashboard(browser, srv, problems)
    try:
        page.wait_for_selector("#status.live", timeout=TIMEOUT_MS)
        name = f"dash-{uuid.uuid4().hex[:8]}"
        assert page.locator(f'tr[data-stream="{name}"]').count() == 0
        in_thread(create, srv.port, name)            # created while the page is open
        cell = records_cell(page, name)
        cell.wait_for(timeout=TIMEOUT_MS)
        assert cell.inner_text() == "0"
        in_thread(publish, srv.port, name, 0, 250)
        page.wait_for_function(
            """([name, want]) => { const c = document.querySelector(`#streams tr[data-stream="${name}"] td.records`);
                                   return c && c.textContent === want; }""",
            arg=[name, "250"], timeout=TIMEOUT_MS)
        in_thread(publish, srv.port, name, 250, 1000)
        page.wait_for_function(
            """([name, want]) => { const c = document.querySelector(`#streams tr[data-stream="${name}"] td.records`);
                                   return c && c.textContent === want; }""",
            arg=[name, "1,250"], timeout=TIMEOUT_MS)
        # its line is on the rate chart, and the totals count it
        assert int(page.locator("#total-streams").inner_text()) >= 1
        page.wait_for_selector("#chart-rate polyline.series", timeout=TIMEOUT_MS)
        assert name in page.locator("#legend-rate").inner_text()

        # picking it shows its last records, JSON pretty-printed, newest first
        page.locator(f'#streams tbody tr[data-stream="{name}"]').click()
        page.wait_for_selector('#records .record[data-offset="1249"]', timeout=TIMEOUT_MS)
        assert page.locator("#records-stream").inner_text() == name
        first = page.locator("#records .record").first
        assert first.get_attribute("data-offset") == "1249"
        assert json.loads(first.locator("pre").inner_text()) == {"n": 1249, "kind": "order"}
        assert page.locator("#records .record").count() == 20
    finally:
        ctx.close()
    assert problems == []


def test_dashboard_opens_without_a_login_on_loopback(browser, srv):
    """No users file: a browser on loopback opening http://127.0.0.1:PORT/ sees the dashboard at once, as
    every listener serves loopback clients without credentials then (DESIGN.md, "Auth")."""
    problems = []
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})     # no http_credentials
    try:
        page = ctx.new_page()
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        resp = page.goto(f"http://127.0.0.1:{srv.ports['http']}/", wait_until="load")
        assert resp.status == 200
        page.wait_for_selector("#status.live", timeout=TIMEOUT_MS)
    finally:
        ctx.close()
    assert problems == []


@pytest.fixture(scope="module")
def srv_users(tmp_path_factory):
    from riverbed.shells import auth
    base = tmp_path_factory.mktemp("dashboard-users")
    auth.add_user(str(base / "users.toml"), "admin", "adminpw")
    s = ServerProcess(base / "data", "--http-port", "0", "--users", str(base / "users.toml")).start()
    yield s
    assert s.stop() == 0


def test_dashboard_needs_credentials_with_a_users_file(browser, srv_users):
    ctx = browser.new_context()
    try:
        base = f"http://127.0.0.1:{srv_users.ports['http']}"
        for path in ("/", "/static/dashboard.js", "/api/events"):
            resp = ctx.request.get(base + path)
            assert resp.status == 401, path
            assert resp.headers["www-authenticate"].startswith("Basic"), path
        # the browser itself gives up on a page that wants credentials it does not have
        with pytest.raises(Exception, match="AUTH"):
            ctx.new_page().goto(base + "/")
    finally:
        ctx.close()
