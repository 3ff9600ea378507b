"""The locks page (``celery singleton web``) as a real process against real Redis and a real worker
holding locks in every state: over HTTP (no JavaScript), and in headless Chromium.

States made for real: running, reserved (a message waiting for its countdown), queued (a
message in a queue no worker reads), an orphan (a queued hold whose message is in no
queue); a throttle window, a rate's schedule and a value this library did not write are
put in the store directly (their making is the modes' tests' business).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from celery import chain

from celery_singleton_lock.contrib import limits
from celery_singleton_lock.lease import Lease, LockKeys, Rate, companion, rates_of
from celery_singleton_lock.tokens import queued_token, running_token

from ..conftest import CeleryEnv
from ..support.runs import started, wait_for
from ..support.web import CHROMEDRIVER, CHROMIUM, browser, form_of, page_server
from ..support.workers import Worker

pytestmark = pytest.mark.slow


@dataclass
class Held:
    """What the module's locks are: task ids and keys by state."""

    ids: dict[str, str]
    keys: dict[str, str]
    worker: Worker


def key_of(task: Any, *args: Any, role: str | None = None) -> str:
    name = task.singleton_options().key.derive(args, {})
    store = task.singleton_context.store
    return str(store.keys(companion(name, role) if role else name).lock)


@pytest.fixture(name="cenv", scope="module")
def fixture_cenv_kept(celery_env: CeleryEnv) -> CeleryEnv:
    """The store emptied once for the module, not before each test (conftest's ``cenv``):
    the module's locks are made once."""
    client = celery_env.lock.client()
    client.flushdb()
    client.close()
    return celery_env


@pytest.fixture(name="held", scope="module")
def fixture_held(cenv: CeleryEnv) -> Iterator[Held]:
    celery_env = cenv
    app = celery_env.app_module
    worker = Worker(celery_env.env, concurrency=2).start()
    store = app.work.singleton_context.store
    try:
        tag = uuid.uuid4().hex[:8]
        running = app.work.apply_async((f"running-{tag}", 120.0), queue=worker.queue)
        reserved = app.latest_queued.apply_async((f"reserved-{tag}", "v"), countdown=300,
                                                 queue=worker.queue)  # fmt: skip
        queued = app.work.apply_async((f"queued-{tag}",), queue=f"parked-{tag}")
        # The default lock: the worker takes the running lease as the message arrives,
        # and its run has not started (its countdown): shown reserved, as the worker says.
        prefetched = app.work.apply_async((f"prefetched-{tag}",), countdown=300,
                                          queue=worker.queue)  # fmt: skip
        orphan = str(uuid.uuid4())  # a queued hold whose message is nowhere
        orphan_name = app.work.singleton_options().key.derive((f"orphan-{tag}",), {})
        assert isinstance(store.try_acquire(orphan_name, 600, token=queued_token(orphan)), Lease)
        window = companion(app.throttled.singleton_options().key.derive((f"t-{tag}",), {}),
                           "throttle")  # fmt: skip
        assert isinstance(store.try_acquire(window, 600, token=queued_token("w")), Lease)
        rate_name = app.rated.singleton_options().key.derive((f"r-{tag}",), {})
        for _ in range(3):  # one slot a minute: the schedule stands for minutes
            rates_of(store).ask(rate_name, Rate(1, 60.0), "reserve")
        wait_for(lambda: any(s["item"] == f"running-{tag}" for s in started(celery_env)), 20,
                 "the running task")  # fmt: skip
        for step in (1, 2):  # two chains whose first step waits for the running call
            chain(app.work.si(f"running-{tag}").set(queue=worker.queue),
                  app.follow.s(step).set(queue=worker.queue)).apply_async()  # fmt: skip
        prefetched_name = app.work.singleton_options().key.derive((f"prefetched-{tag}",), {})
        wait_for(lambda: (store.holder(prefetched_name) or "").startswith("x|"), 20,
                 "the prefetched message's lease taken as it arrived")  # fmt: skip
        yield Held(
            ids={
                "running": running.id,
                "reserved": reserved.id,
                "prefetched": prefetched.id,
                "queued": queued.id,
                "orphaned": orphan,
            },
            keys={
                "running": key_of(app.work, f"running-{tag}"),
                "reserved": key_of(app.latest_queued, f"reserved-{tag}", "v"),
                "queued": key_of(app.work, f"queued-{tag}"),
                "prefetched": key_of(app.work, f"prefetched-{tag}"),
                "orphaned": key_of(app.work, f"orphan-{tag}"),
                "throttled": str(store.keys(window).lock),
                "limited": str(store.keys(rate_name).lock) + ":rate",
            },
            worker=worker,
        )
    finally:
        worker.kill()  # not a warm shutdown: that would wait for the long task


def rows_of(html: str) -> dict[str, str]:
    """key -> state of the list's rows, as the server rendered them."""
    import re

    found = re.findall(r'<tr data-key="([^"]+)" data-state="([^"]+)">', html)
    return {_unescape(key): state for key, state in found}


def attached_of(html: str) -> dict[str, str]:
    """key -> the list's count of calls attached under that row's holder."""
    import re

    pattern = r'<tr data-key="([^"]+)"[^>]*>.*?<td class="num attached">([^<]*)</td>'
    return {_unescape(key): count for key, count in re.findall(pattern, html, flags=re.DOTALL)}


def _unescape(text: str) -> str:
    import html

    return html.unescape(text)


class TestWithoutJavaScript:
    def test_the_list_shows_each_state_and_filters_search_and_sort_on_the_server(
        self, cenv: CeleryEnv, held: Held
    ) -> None:
        with page_server(cenv.env) as page:
            reply = page.request("/?per=500")
            listed = rows_of(reply.body)
            for state in ("running", "reserved", "queued", "throttled", "limited"):
                assert listed.get(held.keys[state]) == state, (state, listed)
            assert listed[held.keys["orphaned"]] == "queued"  # the store cannot tell
            # A running lease whose run its worker has not started: reserved, as it says.
            assert listed[held.keys["prefetched"]] == "reserved"
            only = rows_of(page.request("/?state=running&per=500").body)
            assert held.keys["running"] in only
            assert set(only.values()) == {"running"}
            by_task = rows_of(page.request(f"/?task={cenv.app_module.latest_queued.name}").body)
            assert held.keys["reserved"] in by_task
            assert held.keys["running"] not in by_task
            found = rows_of(page.request(f"/?q={held.ids['queued']}").body)
            assert list(found) == [held.keys["queued"]]
            orphans = rows_of(page.request("/?state=orphaned&per=500").body)
            assert held.keys["orphaned"] in orphans
            assert held.keys["queued"] not in orphans  # its message is in a queue
            assert held.keys["running"] not in orphans, page.request(
                "/?state=orphaned&per=500"
            ).body[-2500:]

    def test_the_list_counts_the_calls_attached_under_each_holder(
        self, cenv: CeleryEnv, held: Held
    ) -> None:
        with page_server(cenv.env) as page:
            counts = attached_of(page.request("/?per=500").body)
        assert counts[held.keys["running"]] == "2"
        assert counts[held.keys["queued"]] == "-"
        assert set(counts.values()) == {"2", "-"}

    def test_sorting_by_age_both_ways(self, cenv: CeleryEnv, held: Held) -> None:
        store = cenv.app_module.work.singleton_context.store
        tag = uuid.uuid4().hex[:8]
        keys = []
        for hours in (2, 3, 1):  # a hold's token says when it was taken (ms since the epoch)
            since = int((time.time() - hours * 3600) * 1000)
            name = f"aged-{tag}-{hours}h"
            assert isinstance(store.try_acquire(name, 120, token=f"q|{since}-0a0b0c0d|{name}"),
                              Lease)  # fmt: skip
            keys.append((hours, str(store.keys(name).lock)))
        oldest_first = [key for _, key in sorted(keys, reverse=True)]
        with page_server(cenv.env) as page:
            assert list(rows_of(page.request(f"/?q=aged-{tag}").body)) == oldest_first
            newest = page.request(f"/?q=aged-{tag}&sort=newest").body
            assert list(rows_of(newest)) == oldest_first[::-1]
            assert ">3h<" in newest or ">3h0m<" in newest or "3h" in newest

    def test_paging_walks_every_lock_once(self, cenv: CeleryEnv, held: Held) -> None:
        store = cenv.app_module.work.singleton_context.store
        names = [f"page-{uuid.uuid4().hex}" for _ in range(25)]
        for name in names:
            assert isinstance(store.try_acquire(name, 120, token=queued_token(name)), Lease)
        with page_server(cenv.env) as page:
            seen: list[str] = []
            for number in (1, 2, 3):
                seen += list(rows_of(page.request(f"/?q=page-&per=10&page={number}").body))
            assert sorted(seen) == sorted(str(store.keys(n).lock) for n in names)
            assert "page 3 of 3" in page.request("/?q=page-&per=10&page=3").body

    def test_the_lock_page_says_whether_the_holder_lives_and_shows_the_task_options(
        self, cenv: CeleryEnv, held: Held
    ) -> None:
        with page_server(cenv.env) as page:
            running = page.request(f"/lock?key={quote(held.keys['running'])}").body
            assert "<strong>alive</strong>" in running
            assert held.worker.name in running
            assert "<th>ttl</th>" in running
            assert "until_executed" in running
            orphan = page.request(f"/lock?key={quote(held.keys['orphaned'])}").body
            assert "<strong>gone</strong>" in orphan
            assert "no worker has it" in orphan
            assert "release" not in orphan.lower().split("<main>")[1]  # read-only: no forms
            missing = page.request("/lock?key=t:{nothing-here}")
            assert missing.status == 404

    def test_the_idempotency_page_lists_each_key_with_its_first_call(
        self, cenv: CeleryEnv, held: Held
    ) -> None:
        charge = cenv.app_module.charge
        tag = uuid.uuid4().hex[:8]
        first = charge.apply_async((f"web-{tag}",), idempotency_key=f"k1-{tag}", queue="parked-web")
        other = charge.apply_async(
            (f"web2-{tag}",), idempotency_key=f"k2-{tag}", queue="parked-web"
        )
        with page_server(cenv.env) as page:
            listing = page.request("/idempotency")
            assert listing.status == 200
            keys = rows_of(listing.body)
            assert keys[f"k1-{tag}"] == keys[f"k2-{tag}"] == "accepted"
            assert first.id in listing.body
            assert other.id in listing.body
            found = page.request(f"/idempotency?q={first.id}").body
            assert rows_of(found) == {f"k1-{tag}": "accepted"}
            assert "No idempotency keys match" in page.request("/idempotency?state=failed").body
            assert 'href="/idempotency"' in page.request("/").body  # linked from every page

    def test_the_limits_page_shows_an_override_beside_the_code(
        self, cenv: CeleryEnv, held: Held
    ) -> None:
        app, target = cenv.app_module.app, "tests.support.celery_app.rated_pair"
        limits.set(app, target, rate="2/s", paused=True, by="ops@web-test")
        try:
            with page_server(cenv.env) as page:
                listing = page.request("/limits")
                assert 'href="/limits"' in page.request("/").body  # linked from every page
        finally:
            limits.set(app, target, reset=True)
        assert listing.status == 200
        row = listing.body.split(f'data-target="{target}"', 1)[1].split("</tr>", 1)[0]
        assert "<td>rate 10/s; limit 2</td>" in row
        assert "<strong>rate 2/s; paused</strong>" in row
        assert "ops@web-test" in row

    def test_a_page_never_shows_a_password(self, cenv: CeleryEnv, held: Held) -> None:
        with page_server(cenv.env) as page:
            body = page.request("/").body
        assert cenv.env["CSL_LOCK_URL"].split("@")[-1] in body  # the store, without secrets
        assert "password" not in body.lower()


class TestTheCommand:
    def test_a_port_already_taken_is_an_error_that_says_so(self, cenv: CeleryEnv) -> None:
        import os
        import socket
        import subprocess
        import sys

        from ..support.workers import ROOT

        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            done = subprocess.run(
                [sys.executable, "-m", "celery", "-A", "tests.support.celery_app", "singleton",
                 "web", f"--port={port}"],
                cwd=ROOT, env={**os.environ, **cenv.env}, capture_output=True, text=True,
                timeout=60, check=False,
            )  # fmt: skip
        assert done.returncode == 1, done.stderr
        assert f"Error: cannot listen on 127.0.0.1:{port}" in done.stderr
        assert "Traceback" not in done.stderr


class TestReleases:
    def test_releases_are_refused_unless_the_page_was_started_with_them(
        self, cenv: CeleryEnv, held: Held
    ) -> None:
        with page_server(cenv.env) as page:
            reply = page.request(
                "/release", {"key": held.keys["orphaned"], "token": "x", "csrf": "x"}
            )
        assert reply.status == 403
        assert "--allow-release" in reply.body

    def test_a_release_without_the_page_s_own_token_or_from_another_site_is_refused(
        self, cenv: CeleryEnv, held: Held
    ) -> None:
        with page_server(cenv.env, "--allow-release") as page:
            html = page.request(f"/lock?key={quote(held.keys['orphaned'])}").body
            form = form_of(html, held.keys["orphaned"])
            forged = page.request("/release", {**form, "csrf": "0" * 64})
            assert forged.status == 403
            assert "token" in forged.body
            elsewhere = page.request("/release", form, headers={"Origin": "https://evil.example"})
            assert elsewhere.status == 403
            assert "another site" in elsewhere.body
        store = cenv.lock_client()
        assert store.exists(held.keys["orphaned"]) == 1

    def test_a_live_lock_needs_the_confirmation_and_a_stale_form_releases_nothing(
        self, cenv: CeleryEnv, held: Held
    ) -> None:
        with page_server(cenv.env, "--allow-release") as page:
            stale = form_of(page.request(f"/lock?key={quote(held.keys['queued'])}").body,
                            held.keys["queued"])  # fmt: skip
            stale["token"] += "-not-it"
            moved = page.request("/release", {**stale, "confirm": "yes"})
            assert moved.status == 303
            assert "done=changed" in moved.headers["location"]
            assert cenv.lock_client().exists(held.keys["queued"]) == 1
            # A queued hold whose message is in a queue: alive, so it asks first.
            form = form_of(page.request(f"/lock?key={quote(held.keys['queued'])}").body,
                           held.keys["queued"])  # fmt: skip
            asked = page.request("/release", form)
            assert asked.status == 409
            assert "Release it anyway" in asked.body
            assert cenv.lock_client().exists(held.keys["queued"]) == 1


class TestAuth:
    def test_an_unauthenticated_request_is_refused_when_auth_is_set(
        self, cenv: CeleryEnv, held: Held
    ) -> None:
        with page_server(cenv.env, auth="ops:s3cret pass") as page:
            assert page.request("/", auth="").status == 401
            assert page.request("/", auth="ops:wrong").status == 401
            assert page.request("/static/app.js", auth="").status == 401
            refused = page.request("/release", {"key": "k"}, auth="")
            assert refused.status == 401
            assert refused.headers.get("www-authenticate", "").startswith("Basic")
            assert page.request("/").status == 200
        assert "s3cret" not in page.output()


def row_states(driver: Any) -> dict[str, str]:
    """Key -> state of every row of the list, read in one script: the page replaces its
    rows as it refreshes, so a row found one call earlier may be gone by the next."""
    return dict(
        driver.execute_script(
            "return Array.from(document.querySelectorAll('#locks tbody tr'),"
            " (row) => [row.dataset.key, row.dataset.state]);"
        )
    )


@pytest.mark.oneoff  # a Chromium each: in CI's one-offs (the page's server side is tested above)
@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="needs chromium and chromium-driver")
class TestInABrowser:
    def test_the_list_refreshes_in_place_and_filters(self, cenv: CeleryEnv, held: Held) -> None:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import Select, WebDriverWait

        store = cenv.app_module.work.singleton_context.store
        with page_server(cenv.env, "--refresh=1") as page, browser() as driver:
            driver.get(f"{page.url}/?per=500")
            states = row_states(driver)
            for state in ("running", "reserved", "queued", "throttled", "limited"):
                assert states.get(held.keys[state]) == state
            driver.execute_script("window.notReloaded = true")
            later = f"later-{uuid.uuid4().hex}"
            assert isinstance(store.try_acquire(later, 120, token=queued_token(later)), Lease)
            wanted = str(store.keys(later).lock)
            WebDriverWait(driver, 15).until(
                lambda d: d.find_elements(By.CSS_SELECTOR, f'tr[data-key="{wanted}"]')
            )
            assert driver.execute_script("return window.notReloaded") is True
            Select(driver.find_element(By.ID, "state")).select_by_value("running")
            driver.find_element(By.ID, "apply").click()
            WebDriverWait(driver, 15).until(lambda d: "state=running" in d.current_url)
            assert set(row_states(driver).values()) == {"running"}

    def test_releasing_an_orphan_frees_it_and_a_live_one_needs_the_confirmation(
        self, cenv: CeleryEnv, held: Held
    ) -> None:
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        client = cenv.lock_client()
        with page_server(cenv.env, "--allow-release", "--refresh=0") as page, browser() as d:
            d.get(f"{page.url}/lock?{urlencode({'key': held.keys['orphaned']})}")
            d.find_element(By.CSS_SELECTOR, "form.release button").click()
            WebDriverWait(d, 15).until(lambda d: d.find_elements(By.ID, "done"))
            assert d.find_element(By.ID, "done").text == "Released."
            assert client.exists(held.keys["orphaned"]) == 0
            d.get(f"{page.url}/lock?{urlencode({'key': held.keys['queued']})}")
            d.find_element(By.CSS_SELECTOR, "form.release button").click()
            # The browser refuses the form: its confirmation box is required, and unticked.
            validity = "return document.querySelector('form.release').checkValidity()"
            assert d.execute_script(validity) is False
            assert "done=" not in d.current_url
            assert client.exists(held.keys["queued"]) == 1
            d.find_element(By.CSS_SELECTOR, "form.release input[name=confirm]").click()
            d.find_element(By.CSS_SELECTOR, "form.release button").click()
            WebDriverWait(d, 15).until(lambda d: d.find_elements(By.ID, "done"))
            assert client.exists(held.keys["queued"]) == 0

    def test_the_history_of_a_refused_call_names_its_holder(
        self, cenv: CeleryEnv, held: Held
    ) -> None:
        from selenium.webdriver.common.by import By

        task = cenv.app_module.chronicled  # history=True
        first = task.apply_async(("web-history",), queue="parked-web-history")
        task.apply_async(("web-history",), queue="parked-web-history")
        key = key_of(task, "web-history")
        with page_server(cenv.env, "--refresh=0") as page, browser() as driver:
            driver.get(f"{page.url}/lock?{urlencode({'key': key})}")
            rows = driver.find_elements(By.CSS_SELECTOR, "#history tbody tr")
            assert [r.get_attribute("data-event") for r in rows] == ["refused", "accepted"]
            holder = rows[0].find_element(By.CSS_SELECTOR, "td.holder").text
            assert holder == f"{first.id} (queued)"

    def test_the_limits_page_in_a_browser(self, cenv: CeleryEnv, held: Held) -> None:
        from selenium.webdriver.common.by import By

        app, target = cenv.app_module.app, "tests.support.celery_app.export"
        limits.set(app, target, limit=1, by="ops@browser")
        try:
            with page_server(cenv.env, "--refresh=0") as page, browser() as driver:
                driver.get(f"{page.url}/")
                driver.find_element(By.LINK_TEXT, "limits").click()
                row = driver.find_element(By.CSS_SELECTOR, f'#limits tr[data-target="{target}"]')
                assert row.get_attribute("data-override") == "limit 1"
                assert "limit 3" in row.text  # the code's, beside it
        finally:
            limits.set(app, target, reset=True)

    def test_without_credentials_the_browser_gets_no_page(
        self, cenv: CeleryEnv, held: Held
    ) -> None:
        from selenium.webdriver.common.by import By

        with page_server(cenv.env, auth="ops:pw") as page, browser() as driver:
            driver.get(f"{page.url}/")  # answered 401: the browser shows nothing of the page
            assert not driver.find_elements(By.ID, "summary")
            assert "celery-singleton-lock" not in driver.page_source
            host = page.url.removeprefix("http://")
            driver.get(f"http://ops:pw@{host}/")  # what a browser sends once asked
            assert driver.find_elements(By.ID, "summary")

    def test_a_screenshot_of_the_list(self, cenv: CeleryEnv, held: Held, tmp_path: Path) -> None:
        """``python3 scripts/dev.py screenshot`` writes it into the docs (CSL_SCREENSHOT)."""
        import os

        target = Path(os.environ.get("CSL_SCREENSHOT") or tmp_path / "list.png")
        with page_server(cenv.env, "--refresh=0") as page, browser() as driver:
            driver.set_window_size(1400, 760)
            driver.get(f"{page.url}/?per=12")
            driver.save_screenshot(str(target))
        assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.oneoff  # a scale test: 100,000 locks
@pytest.mark.load
class TestAtScale:
    def test_a_page_of_100_000_locks_is_read_in_one_pass_and_pages(
        self, cenv: CeleryEnv, held: Held
    ) -> None:
        """Prints how long a page takes (speed targets live in ``dev.py bench``)."""
        client, count = cenv.lock_client(), 100_000
        keys = []
        for start in range(0, count, 10_000):
            pipe = client.pipeline(transaction=False)
            for n in range(start, start + 10_000):
                name = f"tests.support.celery_app.work:{n:064x}"
                keys.append(LockKeys.build("t", name).lock)
                pipe.set(keys[-1], running_token(f"bulk{n}", "w@h", 1), px=600_000)
            pipe.execute()
        try:
            with page_server(cenv.env) as page:
                timings = {}
                for query in ("/", "/?page=1000&per=100", "/?q=bulk4242&sort=newest"):
                    began = time.perf_counter()
                    reply = page.request(query)
                    timings[query] = time.perf_counter() - began
                    assert reply.status == 200
                assert f'data-key="{keys[4242]}"' in page.request("/?q=bulk4242").body
                deep = page.request("/?page=1001&per=100").body
                assert "narrow the filters" in deep
            print(f"\nthe page over {count} locks: " + ", ".join(
                f"{query} {seconds:.2f}s" for query, seconds in timings.items()
            ))  # fmt: skip
        finally:
            for start in range(0, count, 10_000):
                client.delete(*keys[start : start + 10_000])
