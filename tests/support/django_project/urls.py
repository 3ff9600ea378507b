"""The locks page under the admin's login, as the docs show it (docs/operations.md)."""

from django.contrib import admin
from django.urls import include, path

from celery_singleton_lock.contrib.web.django import urls as locks_urls
from tests.support.celery_app import app as celery_app

urlpatterns = [
    path(
        "admin/locks/",
        include(locks_urls(celery_app, wrap=admin.site.admin_view, allow_release=True)),
    ),
    path("admin/", admin.site.urls),
]
