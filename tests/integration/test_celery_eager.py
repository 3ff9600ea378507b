"""``task_always_eager`` (memory:// and Redis), the decorator's forms, and ``self.lease``."""

from __future__ import annotations

import datetime
import itertools
import time
from typing import Any, ClassVar

import pytest
import redis
from celery import Celery, shared_task

from celery_singleton_lock import (
    ConfigurationError,
    CostOverBurstError,
    DuplicateTaskError,
    KeyDerivationError,
    LockLostError,
    RateLimit,
    RateLimitedError,
    SingletonTask,
    signals,
    singleton_task,
)
from celery_singleton_lock.contrib.testing import hold, manual_clock
from celery_singleton_lock.tokens import holder_task_id, queued_token, running_token

from ..support.apps import eager_app
from ..support.servers import RedisServer


@pytest.fixture(name="app", params=["memory", "redis"])
def fixture_app(
    request: pytest.FixtureRequest, raw: redis.Redis, redis_server: RedisServer
) -> Celery:
    url = "memory://" if request.param == "memory" else redis_server.url
    return eager_app(url, f"eager-{request.param}")


class TestEager:
    def test_runs_with_a_lease_and_releases(self, app: Celery) -> None:
        seen: list[int] = []

        @singleton_task(app=app, bind=True, name=f"{app.main}.charge", key=["order_id"])
        def charge(self: Any, order_id: int, amount: float = 1.0) -> int:
            self.lease.check()
            seen.append(self.lease.fence)
            return order_id

        assert charge.delay(5).get() == 5
        assert charge.apply_async((5,), {"amount": 2.0}).get() == 5  # the key was released
        assert charge.apply((5,)).get() == 5
        assert len(seen) == 3
        assert seen == sorted(seen)
        assert len(set(seen)) == 3

    def test_nested_duplicate_is_refused_while_the_outer_one_runs(self, app: Celery) -> None:
        @singleton_task(
            app=app, bind=True, name=f"{app.main}.outer", key=["n"], on_duplicate="raise"
        )
        def outer(self: Any, n: int, nested: bool = True) -> str:
            if nested:
                with pytest.raises(DuplicateTaskError) as caught:
                    outer.delay(n, nested=False)
                return str(caught.value.task_id)
            return "inner ran"

        result = outer.delay(1)
        assert result.get() == result.id

    def test_eager_retry_runs_again_and_releases(self, app: Celery) -> None:
        attempts: list[int] = []

        @singleton_task(app=app, bind=True, name=f"{app.main}.flaky", key=["n"], max_retries=2)
        def flaky(self: Any, n: int) -> int:
            attempts.append(self.request.retries)
            if self.request.retries < 2:
                raise self.retry(countdown=0)
            return n

        assert flaky.delay(3).get() == 3
        assert attempts == [0, 1, 2]
        assert flaky.delay(3).get() == 3

    def test_a_rate_makes_the_caller_wait_for_each_slot(self, app: Celery) -> None:
        slots: list[float] = []

        @singleton_task(app=app, bind=True, name=f"{app.main}.rated", key=["n"], rate="20/s")
        def rated(self: Any, n: int) -> int:
            slots.append(self.request.singleton_rate_slot)
            return n

        began = time.monotonic()
        assert [rated.delay(1).get() for _ in range(4)] == [1] * 4
        assert time.monotonic() - began >= 0.15 - 0.005  # three waits of 1/20 s
        gaps = [b - a for a, b in itertools.pairwise(slots)]
        assert gaps == pytest.approx([0.05] * 3, abs=1e-3)
        assert rated.delay(2).get() == 2  # another key has a budget of its own

    def test_tasks_sharing_a_key_template_share_its_rate(self, app: Celery) -> None:
        slots: list[float] = []

        def body(self: Any, tenant: str, n: int) -> int:
            slots.append(self.request.singleton_rate_slot)
            return n

        options = {"bind": True, "key": "tenant:{tenant}", "rate": "10/s", "on_limited": "raise"}
        pull = singleton_task(app=app, name=f"{app.main}.pull", **options)(body)
        push = singleton_task(app=app, name=f"{app.main}.push", **options)(body)
        assert pull.delay("acme", 1).get() == 1
        with pytest.raises(RateLimitedError, match="'tenant:acme' is over its rate"):
            push.delay("acme", 2)  # the other task's call spent the key's slot
        assert push.delay("other", 3).get() == 3

    def test_a_rate_plan_and_raise_at_dispatch(self, app: Celery) -> None:
        @singleton_task(
            app=app,
            name=f"{app.main}.sms",
            key=["user"],
            rate=lambda user: None if user == "ops" else "1/m",
            on_limited="raise",
        )
        def sms(user: str) -> str:
            return user

        assert sms.delay("ann").get() == "ann"
        with pytest.raises(RateLimitedError, match="over its rate of 1/m") as refused:
            sms.delay("ann")
        assert 59 < refused.value.retry_after <= 60
        assert [sms.delay("ops").get() for _ in range(3)] == ["ops"] * 3  # not limited

    def test_several_limits_and_a_cost_are_one_decision(self, app: Celery) -> None:
        def tokens(account: str, prompt: str) -> int:
            return len(prompt.split())

        @singleton_task(
            app=app,
            name=f"{app.main}.complete",
            key=["account"],
            rate=["3/m", RateLimit("10/m", burst=6, cost=tokens)],
            burst=3,  # the bare limit's
            on_limited="raise",
        )
        def complete(account: str, prompt: str) -> str:
            return prompt

        assert complete.delay("a", "one two three four").get()  # 1 call, 4 tokens
        # 3 tokens more would pass the call limit but not the token limit's burst left
        # (6 - 4 = 2): refused by that one, and charged against neither.
        with pytest.raises(RateLimitedError, match=r"10/m \(burst 6\) \(this call costs 3\)"):
            complete.delay("a", "five six seven")
        assert complete.delay("a", "five six").get()  # 2 tokens: fits; 2 calls of 3
        assert complete.delay("a", "").get() == ""  # no tokens: the third call
        with pytest.raises(RateLimitedError, match=r"over its rate of 3/m \(burst 3\);"):
            complete.delay("a", "")  # the call limit (the two refused counted nothing)
        # More than the token burst could never start: said before anything is sent.
        with pytest.raises(CostOverBurstError, match=r"can never start under 10/m.*burst=7"):
            complete.delay("b", "1 2 3 4 5 6 7")

    def test_cancel_mode_runs_eagerly_with_a_lease_that_is_never_cancelled(
        self, app: Celery
    ) -> None:
        @singleton_task(app=app, bind=True, name=f"{app.main}.render", on_duplicate="cancel")
        def render(self: Any, doc: str) -> bool:
            self.lease.check()
            return self.lease.cancelled

        assert [render.delay("d").get() for _ in range(2)] == [False, False]

    def test_calling_the_task_as_a_function_takes_no_lock(self, app: Celery) -> None:
        @singleton_task(app=app, bind=True, name=f"{app.main}.plain")
        def plain(self: Any, n: int) -> int:
            with pytest.raises(RuntimeError, match="only while the task runs"):
                _ = self.lease
            return n

        assert plain(4) == 4


class TestManualClock:
    """memory:// on a ``ManualClock``: time passes when the test says, and only then."""

    def test_an_eager_rate_wait_moves_the_clock_instead_of_sleeping(self) -> None:
        app = eager_app("memory://", "eager-clock")
        slots: list[float] = []

        @singleton_task(app=app, bind=True, name="eager-clock.rated", key=["n"], rate="20/s")
        def rated(self: Any, n: int) -> int:
            slots.append(self.request.singleton_rate_slot)
            return n

        with manual_clock(app) as clock:
            began = clock.time()
            assert [rated.delay(1).get() for _ in range(4)] == [1] * 4
            # Three waits of 1/20 s, to the microsecond: no real clock took part.
            assert clock.time() - began == pytest.approx(0.15, abs=1e-6)
            # To the microsecond too: the rate script counts in whole microseconds.
            gaps = [b - a for a, b in itertools.pairwise(slots)]
            assert gaps == pytest.approx([0.05] * 3, abs=1e-6)
        assert app.conf.singleton_lock_url == "memory://"

    def test_a_ttl_runs_out_when_the_clock_passes_it(self) -> None:
        app = eager_app("memory://", "eager-ttl")

        @singleton_task(app=app, name="eager-ttl.sync", key=["k"], ttl=30)
        def sync(k: str) -> str:
            return k

        with manual_clock(app) as clock, hold(sync, "a") as holder:
            assert sync.delay("a").id == holder.task_id
            clock.advance(29.5)
            assert sync.delay("a").id == holder.task_id
            clock.advance(datetime.timedelta(seconds=1))  # the holder died 30.5 s ago
            assert sync.delay("a").get() == "a"

    def test_only_the_memory_store_takes_a_manual_clock(self, redis_server: RedisServer) -> None:
        app = eager_app(redis_server.url, "eager-redis-clock")
        with pytest.raises(ConfigurationError, match="memory://"), manual_clock(app):
            pass


class TestDecorator:
    def test_bare_decorator_binds_like_shared_task(self) -> None:
        @singleton_task
        def rebuild_index_bare(tenant_id: int) -> int:  # shared: name must be unique
            return tenant_id

        app = eager_app("memory://", "shared")
        task = app.tasks[rebuild_index_bare.name]
        assert isinstance(task, SingletonTask)
        assert task.delay(9).get() == 9
        del rebuild_index_bare

    def test_celery_options_pass_through(self) -> None:
        app = eager_app("memory://", "options")

        @singleton_task(
            app=app, bind=True, max_retries=7, acks_late=True, ttl=12, queue_ttl=60, name="o.job"
        )
        def job(self: Any) -> None: ...

        assert job.max_retries == 7
        assert job.acks_late is True
        options = job.singleton_options()
        assert (options.ttl, options.queue_ttl) == (12, 60)

    def test_base_class_form_with_singleton_options(self) -> None:
        app = eager_app("memory://", "base")
        app.finalize()

        @app.task(
            base=SingletonTask, singleton={"key": "request:{request_idx}"}, name="base.process"
        )
        def process_request(request_idx: int) -> int:
            return request_idx

        assert process_request.singleton_options().key.derive((3,)) == "request:3"
        with pytest.raises(ConfigurationError, match="unknown singleton option"):

            @app.task(base=SingletonTask, singleton={"keys": ["x"]}, name="base.bad", shared=False)
            def bad(x: int) -> None: ...

    def test_misuse_says_what_to_write(self) -> None:
        with pytest.raises(ConfigurationError, match="@singleton_task"):
            singleton_task("key")  # type: ignore[call-overload]
        with pytest.raises(ConfigurationError, match="as keywords"):
            singleton_task(singleton={"key": ["x"]})
        with pytest.raises(ConfigurationError, match="subclass"):
            singleton_task(base=object)

    def test_bad_options_on_shared_tasks_fail_at_decoration(self) -> None:
        with pytest.raises(ConfigurationError, match="not parameters"):

            @singleton_task(key=["missing"], name="bad.shared")
            def job(x: int) -> None: ...

    def test_a_class_registered_the_way_celery_documents_it(self) -> None:
        app = eager_app("memory://", "registered")

        class Rebuild(SingletonTask):
            singleton: ClassVar[dict[str, Any]] = {"key": ["tenant"]}

            def run(self, tenant: int) -> int:
                return tenant

        task = app.register_task(Rebuild())
        assert task.name.endswith("Rebuild")
        assert task.delay(3).get() == 3
        assert task.singleton_options().key.derive((3,)).startswith(task.name)

    def test_arguments_that_do_not_fit_raise_a_type_error_as_celery_does(self, app: Celery) -> None:
        @singleton_task(app=app, name=f"{app.main}.typed", shared=False)
        def typed(order_id: int) -> int:
            return order_id

        with pytest.raises(TypeError, match="do not match the task's signature"):
            typed.delay(1, 2)
        with pytest.raises(KeyDerivationError):
            typed.delay(colour="red")

    def test_shared_task_without_the_plugin_is_unaffected(self) -> None:
        @shared_task(name="plain.ordinary")
        def ordinary(x: int) -> int:
            return x

        assert not isinstance(ordinary, SingletonTask)


class TestTokens:
    def test_holder_task_id_reads_both_token_shapes(self) -> None:
        assert holder_task_id(queued_token("abc-1")) == "abc-1"
        assert holder_task_id(running_token("abc-2", "celery@host", 42)) == "abc-2"
        assert holder_task_id(running_token("with|bar", "h", 1)) == "with|bar"
        assert holder_task_id("garbage") is None
        assert holder_task_id(None) is None


class TestLostLease:
    def test_check_raises_when_the_lease_is_taken_mid_run(
        self, raw: redis.Redis, redis_server: RedisServer
    ) -> None:
        app = eager_app(redis_server.url, "lost")

        @singleton_task(app=app, bind=True, key=["n"], ttl=5, name="lost.job")
        def job(self: Any, n: int) -> str:
            raw.set(self.lease.key, "thief")  # someone else holds it now
            lease = self.lease
            self.singleton_context.store.extend(lease)  # what the renewal thread would do
            with pytest.raises(LockLostError):
                lease.check()
            return "checked"

        assert job.delay(1).get() == "checked"
        assert raw.get("eager:{" + job.singleton_options().key.derive((1,)) + "}") == b"thief"


class TestSignals:
    def test_refusals_and_contention_are_signalled(self, app: Celery) -> None:
        seen: list[tuple[str, Any]] = []

        def on_refused(sender: Any, name: str, holder_id: str | None, **_: Any) -> None:
            seen.append(("refused", holder_id))

        def on_contended(sender: Any, name: str, decision: Any, **_: Any) -> None:
            seen.append(("contended", type(decision).__name__))

        signals.duplicate_refused.connect(on_refused, weak=False)
        signals.execution_contended.connect(on_contended, weak=False)
        try:

            @singleton_task(
                app=app, bind=True, name=f"{app.main}.sig", key=["n"], on_contention="fail"
            )
            def job(self: Any, n: int, nested: bool = True) -> str | None:
                if nested:
                    return str(job.delay(n, nested=False).id)
                return None

            outer = job.delay(1)
            assert outer.get() == outer.id  # the nested duplicate got the holder's result
            store = job.singleton_context.store
            store.try_acquire(job.singleton_options().key.derive((2,)), 5, token="someone")
            with pytest.raises(DuplicateTaskError):
                job.apply((2,), throw=True)
        finally:
            signals.duplicate_refused.disconnect(on_refused)
            signals.execution_contended.disconnect(on_contended)
        assert seen == [("refused", outer.id), ("contended", "Fail")]
