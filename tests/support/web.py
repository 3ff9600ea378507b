"""The locks page for the tests: ``celery singleton web`` as a real process, HTTP helpers, and a
headless Chromium (Debian's ``chromium`` and ``chromium-driver``) driven by Selenium."""

from __future__ import annotations

import base64
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from .servers import free_port
from .workers import ROOT

APP = "tests.support.celery_app"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@dataclass
class Reply:
    status: int
    body: str
    headers: Mapping[str, str] = field(default_factory=dict)


class PageServer:
    """``celery -A tests.support.celery_app singleton web --port P <args>``, stopped by PID."""

    def __init__(self, env: Mapping[str, str], *args: str, auth: str = "") -> None:
        self.port = free_port()
        self.args = list(args)
        self.env = {**os.environ, **env}
        if auth:
            self.env["SINGLETON_LOCK_WEB_BASIC_AUTH"] = auth
        self.auth = auth
        self.log = Path(tempfile.mkdtemp(prefix="csl-web-")) / "web.log"
        self.process: subprocess.Popen[bytes] | None = None
        prefix = next((a.split("=", 1)[1] for a in self.args if a.startswith("--prefix=")), "")
        self.url = f"http://127.0.0.1:{self.port}{prefix}"

    def start(self, timeout: float = 30.0) -> PageServer:
        command = [sys.executable, "-m", "celery", "-A", APP, "singleton", "web",
                   f"--port={self.port}", *self.args]  # fmt: skip
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the page exited:\n{self.output()}")
            try:
                urllib.request.urlopen(f"{self.url}/static/app.css", timeout=2).close()  # noqa: S310  (http only)
            except urllib.error.HTTPError:
                return self  # it answers (401 with auth set)
            except OSError:
                time.sleep(0.1)
            else:
                return self
        self.stop()
        raise RuntimeError(f"the page did not answer in {timeout}s:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def request(
        self,
        path: str,
        form: Mapping[str, str] | None = None,
        *,
        auth: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Reply:
        """GET (or POST ``form``) ``path``, with the server's credentials unless ``auth``."""
        data = urlencode(form).encode() if form is not None else None
        url, sent = f"{self.url}{path}", dict(headers or {})
        request = urllib.request.Request(url, data=data, headers=sent)  # noqa: S310  (http)
        credentials = self.auth if auth is None else auth
        if credentials:
            token = base64.b64encode(credentials.encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            with opener.open(request, timeout=30) as response:
                return Reply(response.status, response.read().decode(), _lower(response.headers))
        except urllib.error.HTTPError as error:
            return Reply(error.code, error.read().decode(), _lower(error.headers))


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a 303 is the answer itself


@contextmanager
def page_server(env: Mapping[str, str], *args: str, auth: str = "") -> Iterator[PageServer]:
    server = PageServer(env, *args, auth=auth).start()
    try:
        yield server
    finally:
        server.stop()


def form_of(html: str, key: str) -> dict[str, str]:
    """The release form's fields for the hold ``key`` on a lock page."""
    for form in re.findall(r"<form[^>]*release[^>]*>(.*?)</form>", html, re.S):
        fields = dict(re.findall(r'name="([^"]+)" value="([^"]*)"', form))
        if _unescape(fields.get("key", "")) == key:
            return {name: _unescape(value) for name, value in fields.items() if name != "confirm"}
    raise AssertionError(f"no release form for {key}")


def _unescape(text: str) -> str:
    import html

    return html.unescape(text)


@contextmanager
def browser(timeout: float = 30.0) -> Iterator[Any]:
    """A headless Chromium, quit (and its driver stopped by PID) at the end."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    if CHROMIUM:
        options.binary_location = CHROMIUM
    flags = ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
             "--window-size=1400,900", "--disable-extensions")  # fmt: skip
    for flag in flags:
        options.add_argument(flag)
    service = Service(CHROMEDRIVER)
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(timeout)
    driver.set_script_timeout(timeout)
    try:
        yield driver
    finally:
        try:
            driver.quit()
        finally:
            process = getattr(service, "process", None)
            if process is not None and process.poll() is None:
                process.kill()


def _lower(headers: Any) -> dict[str, str]:
    """Header names in lower case (HTTP's are case-insensitive)."""
    return {name.lower(): value for name, value in headers.items()}
