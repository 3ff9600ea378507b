"""URLs as settings give them: a failover list read the one way, wherever it is read."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_singleton_lock.config.settings import SingletonConfig, broker_write_url
from celery_singleton_lock.config.visibility import transport_of
from celery_singleton_lock.lease.redis.urls import failover_urls, first_url


class TestFailoverLists:
    @pytest.mark.parametrize(
        ("given", "first"),
        [
            ("redis://a:6379/0", "redis://a:6379/0"),
            ("redis://a/0;redis://b/0", "redis://a/0"),
            (" redis://a/0 ; redis://b/0", "redis://a/0"),
            (["redis://a/0", "redis://b/0"], "redis://a/0"),
            (("redis://a/0;redis://b/0", "redis://c/0"), "redis://a/0"),
            (";redis://b/0", ""),  # as kombu reads it: the part before the first ';'
            ("", ""),
            (None, ""),
            ([], ""),
        ],
    )
    def test_the_first_url_is_the_part_before_the_first_semicolon(
        self, given: object, first: str
    ) -> None:
        assert first_url(given) == first

    @pytest.mark.parametrize(
        ("given", "urls"),
        [
            ("sentinel://a:26379;sentinel://b:26379", ["sentinel://a:26379", "sentinel://b:26379"]),
            ("sentinel://a;; sentinel://b;", ["sentinel://a", "sentinel://b"]),
            (["redis://a", "redis://b;redis://c"], ["redis://a", "redis://b", "redis://c"]),
            (None, []),
        ],
    )
    def test_every_url_of_a_list_stripped_and_none_empty(
        self, given: object, urls: list[str]
    ) -> None:
        assert failover_urls(given) == urls

    @pytest.mark.parametrize(
        "broker",
        ["rediss://b:6380/0;redis://c/0", ["rediss://b:6380/0", "redis://c/0"]],
    )
    def test_each_setting_reads_the_first_the_same_way(self, broker: object) -> None:
        app = Celery("urls", set_as_current=False)
        app.conf.update(broker_url=broker, result_backend="db+sqlite:///x.db")
        assert SingletonConfig.from_app(app).url == "rediss://b:6380/0"
        assert broker_write_url(app.conf) == "rediss://b:6380/0"
        assert transport_of(app.conf) == "rediss"
        app.close()
