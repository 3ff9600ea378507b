"""The library's signals: what a receiver is given (Celery's ``Signal``, no worker needed)."""

from __future__ import annotations

from celery_singleton_lock import signals


def test_receivers_get_the_lock_name_as_name_and_as_the_old_key() -> None:
    got: list[dict[str, object]] = []

    def receiver(sender: object = None, **kwargs: object) -> None:
        got.append({"sender": sender, **kwargs})

    signals.dispatch_accepted.connect(receiver, weak=False)
    try:
        signals.send(signals.dispatch_accepted, "a task", "order:1", task_id="t-1")
    finally:
        signals.dispatch_accepted.disconnect(receiver)
    assert len(got) == 1
    assert got[0]["sender"] == "a task"
    assert got[0]["name"] == got[0]["key"] == "order:1"
    assert got[0]["task_id"] == "t-1"


def test_every_signal_says_it_provides_name() -> None:
    for each in signals.__all__:
        if each == "ride_checked":
            continue  # about a worker's start, not a lock: sent with the app and no name
        signal = getattr(signals, each)
        assert {"name", "key"} <= set(signal.providing_args), each
