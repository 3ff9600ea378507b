"""The locks page mounted in other people's apps: a Django project (under its admin's login)
and a FastAPI app (ASGI), against the real lock store."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from html import unescape
from typing import Any
from urllib.parse import quote, urlencode

import pytest

from celery_singleton_lock.lease import Lease
from celery_singleton_lock.tokens import queued_token

from ..conftest import CeleryEnv


@pytest.fixture(name="django_client")
def fixture_django_client(cenv: CeleryEnv) -> Iterator[Any]:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.django_project.settings")
    import django
    from django.core.management import call_command
    from django.test import Client
    from django.test.utils import setup_test_environment, teardown_test_environment

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)
    setup_test_environment()
    try:
        yield Client()
    finally:
        teardown_test_environment()


def hold(cenv: CeleryEnv, name: str) -> str:
    store = cenv.app_module.work.singleton_context.store
    assert isinstance(store.try_acquire(name, 120, token=queued_token(f"id-{name}")), Lease)
    return str(store.keys(name).lock)


def post(client: Any, path: str, form: dict[str, str]) -> Any:
    """As a browser posts the page's form (urlencoded, not Django's default multipart)."""
    return client.post(path, urlencode(form), content_type="application/x-www-form-urlencoded")


class TestInDjango:
    def test_the_page_is_behind_the_admin_login_and_releases_with_its_own_token(
        self, cenv: CeleryEnv, django_client: Any
    ) -> None:
        from django.contrib.auth.models import User

        key = hold(cenv, "in-django")
        anonymous = django_client.get("/admin/locks/")
        assert anonymous.status_code == 302
        assert "/admin/login/" in anonymous["Location"]
        staff = User.objects.create_user("ops", password="pw", is_staff=True)
        django_client.force_login(staff)
        listing = django_client.get("/admin/locks/?q=in-django")
        assert listing.status_code == 200
        body = listing.content.decode()
        assert f'data-key="{key}"' in unescape(body)
        assert 'href="/admin/locks/static/app.css"' in body  # links under the mount
        assert listing["Content-Security-Policy"].startswith("default-src 'none'")
        page = django_client.get(f"/admin/locks/lock?key={quote(key)}").content.decode()
        fields = dict(re.findall(r'name="(csrf|key|token)" value="([^"]*)"', page))
        fields = {name: unescape(value) for name, value in fields.items()}
        # A queued hold whose message is in no queue: an orphan, released at once.
        released = post(django_client, "/admin/locks/release", fields)
        assert released.status_code == 303, released.content
        assert "done=released" in released["Location"]
        assert cenv.lock_client().exists(key) == 0
        forged = post(django_client, "/admin/locks/release", {**fields, "csrf": "0" * 64})
        assert forged.status_code == 403


class TestInFastAPI:
    def test_the_asgi_app_mounted_under_a_path_lists_and_links_under_it(
        self, cenv: CeleryEnv
    ) -> None:
        from fastapi import FastAPI
        from fastapi.testclient import TestClient

        from celery_singleton_lock.contrib.web import asgi_app

        key = hold(cenv, "in-fastapi")
        api = FastAPI()
        api.mount("/locks", asgi_app(cenv.app_module.app))
        with TestClient(api) as client:
            listing = client.get("/locks/?q=in-fastapi")
            assert listing.status_code == 200
            assert f'data-key="{key}"' in unescape(listing.text)
            assert 'href="/locks/static/app.css"' in listing.text
            lock = client.get("/locks/lock", params={"key": key})
            assert "<strong>gone</strong>" in lock.text
            assert (
                client.get("/locks/static/app.js")
                .headers["content-type"]
                .startswith("text/javascript")
            )
            refused = client.post("/locks/release", data={"key": key})
            assert refused.status_code == 403  # read-only unless allow_release=True
