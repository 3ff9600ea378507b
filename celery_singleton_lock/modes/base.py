"""``Mode``: what a singleton task does to the lock store at each stage of a call's life.

The stages are publish, receipt, start and end (``docs/design.md``; ``Mode`` says what each
does); what a refused call gets is a ``Refusal`` the mode holds. A mode is chosen once, when
the task's options are checked (``SingletonOptions.mode``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, MutableMapping
from typing import TYPE_CHECKING

from ..lease import Contended, Lease, LockStore, Slot, companion
from ..tokens import HOLD_HEADER, NAME_HEADER, TOKEN_HEADER, queued_token
from .refusal import AS_DUPLICATE, Answer, HolderRow, Refusal
from .stages import PENDING, Call, PublishHold, Start, WaitingHold

if TYPE_CHECKING:
    from ..lease.limits.overrides import Override
    from ..lease.limits.turns import Handed, Kept


class Mode:
    """A lock type: one subclass per mode (``modes/<name>.py``), on one shared lock store.

    A call lives through four stages:

    - publish: the producer takes a hold before its message leaves.
    - receipt: the worker's main process turns that hold into its reservation
      (``worker/reservations.py``): the same for every mode that holds.
    - start: the pool child or green thread takes the running lease.
    - end: the running lease is released however the run ends; a dead child's by the main
      process.

    The defaults are those of a call held on its key from publish to the end of its run
    (``until_executed``); a mode overrides the stages it does differently. What a refused
    call gets is its ``refusal``, given to a scope that takes one: as a duplicate, raised or
    returned (``Chosen.as_duplicate``), or swapped in (``modes.replace``).
    """

    name: str
    # publish and start: what a refused call gets (``Refusal``), and what follows from it
    refusal: Refusal = AS_DUPLICATE
    # publish: whether a dispatch takes a hold (and so can refuse a duplicate)
    checks_dispatch: bool = True
    # publish: where the hold lives beside the key (None: on the key itself)
    hold_role: str | None = None
    # end: the ends of a run ("failure", "revoked") after which the key takes the next
    # call at once (``reopen_on``; the options allow it where it changes something)
    reopen_on: frozenset[str] = frozenset()

    def __init__(self, refusal: Refusal | None = None) -> None:
        """A scope made with ``refusal`` (None: the class's own), named after it if it
        names the mode (``replace``)."""
        if refusal is not None:
            self.refusal = refusal
            self.name = refusal.name or self.name

    def __repr__(self) -> str:
        return f"<mode {self.name}>"

    # -- publish (the producer) -----------------------------------------------------------

    def refused_because(self) -> str:
        """Why a duplicate is refused, for its ``DuplicateTaskError``."""
        return "is already queued or running"

    def prepare(self, task: str, options: MutableMapping[str, object]) -> None:
        """Adjust one call's publish options before its hold is planned (debounce)."""

    def token(self, task_id: str) -> str:
        """The token of a new queued hold for ``task_id``."""
        return queued_token(task_id)

    def hold(self, name: str, token: str, ttl: float) -> PublishHold:
        """The hold of a dispatch of lock ``name`` for ``ttl`` s (the queue ttl plus any delay)."""
        headers: dict[str, object] = {NAME_HEADER: name, TOKEN_HEADER: token}
        if self.hold_role is not None:
            headers[HOLD_HEADER] = self.hold_role
        return PublishHold(self._held_lock(name), ttl, token, headers)

    @property
    def overridable(self) -> bool:
        """Whether an operator may change this mode's limits or pause its keys (``celery
        singleton limits set``): only then is an override looked up (a limit's, a rate's)."""
        return False

    @property
    def asks_at_publish(self) -> bool:
        """Whether ``slot_at_publish`` asks the lock store (a rate's ``"delay"`` or
        ``"raise"``): only then is an operator's override looked up at dispatch."""
        return False

    def slot_at_publish(
        self,
        store: LockStore,
        name: str,
        call: Call,
        options: MutableMapping[str, object],
        override: Override | None = None,
    ) -> Slot | None:
        """A rate's slot for a call about to be sent (``rate.py``); None: none taken."""
        return None

    def hold_name(self, name: str) -> str | None:
        """The lock a dispatch of ``name`` holds (None: it holds none)."""
        return self._held_lock(name) if self.checks_dispatch else None

    def answered_by(self, name: str) -> str | None:
        """The lock whose holder answers a duplicate dispatch of ``name`` with one read,
        before anything of it is built; None: none does (no hold, or the answer is a swap
        asked as the message is sent, ``replace.py``)."""
        return self.refusal.answered_by(self.hold_name(name))

    @property
    def attaches(self) -> bool:
        """Whether a canvas member (a chain link, a group or chord member, a call with
        ``link``) whose key is held joins the call holding it (``publish.attaching``): its
        message kept beside the lock, answered with the holder's outcome under its own
        task id. Only a hold on the key itself, whose holder runs the same work: a hold
        beside the key, or a refusal that swaps arguments in, has no one outcome to give."""
        return self.checks_dispatch and self.hold_role is None and self.refusal.attaches

    def answer_refused(self, duplicate: Answer, replacement: Callable[[], Answer]) -> Answer:
        """How a dispatch refused by a holder is answered (``Refusal.answer``): as a
        ``duplicate`` (the holder's result, or ``DuplicateTaskError``), or with the call's
        arguments swapped into the queued call (``replacement``, built only then)."""
        return self.refusal.answer(duplicate, replacement)

    def successor(
        self, queued_id: str, holder: str, options: dict[str, object], ttl: float, queue_ttl: float
    ) -> tuple[str, float, dict[str, object]]:
        """(token, hold ttl, publish options) of a message replacing ``holder``'s."""
        return queued_token(queued_id), ttl, options

    def _held_lock(self, name: str) -> str:
        return name if self.hold_role is None else companion(name, self.hold_role)

    # -- receipt (the worker's main process) ----------------------------------------------

    @property
    def starts_at_receipt(self) -> bool:
        """Whether the worker may take the running lease as the message arrives and hand
        it to the run, which then starts without a round trip of its own: a start that
        takes over the message's hold on the key and looks at nothing else. A replaced
        message, a hold beside the key, or a slot must be looked at when the run starts."""
        looked_at = self.refusal.looked_at_start
        return self.checks_dispatch and self.hold_role is None and not looked_at

    def unless_replaced(self, queued: str | None) -> str | None:
        """The message's queued hold where a later call may have replaced it: a take never
        takes the key over from the hold of that call (None: no call replaces another)."""
        return self.refusal.unless_replaced(queued)

    def waiting_hold(self, role: str | None) -> WaitingHold | None:
        """What the message's hold beside the key (its ``HOLD_HEADER``, ``role``) is to its
        execution: a pending call's hold, kept while it waits (None: nothing to keep)."""
        return WaitingHold(role, offered=self.refusal.offered) if role == PENDING else None

    # -- start (the pool child) -----------------------------------------------------------

    def admit(
        self,
        start: Start,
        call: Call,
        slot: float | None,
        *,
        held: bool = False,
        eager: bool = False,
        turned: bool = False,
    ) -> Slot | None:
        """Before the running lease: a rate's slot for this run (``rate.py``), now or a
        later one reserved for it; ``slot`` is one the message carries (``held``: it
        waited out a pause, and is late for it by that; ``eager``: the caller waits
        for its slot however far; ``turned``: sent on its turn of a waiting room, its
        start given back as it was kept). None: no rate."""
        return None

    @property
    def takes_turns(self) -> bool:
        """Whether a contended start keeps its message in a waiting room, to be sent
        again on its turn (``Start.waiter``; a ``total_limit`` taken round robin)."""
        return False

    def weight(self, call: Call, override: Override | None) -> float:
        """A call's key's share of the turns while other keys wait too (1: an equal one)."""
        return 1.0

    def waits_out_pause(self, start: Start, seconds: float) -> None:
        """A pause keeps this run waiting: its message comes round in ``seconds``. What it
        asks for once let go must still be there then (a rate's schedule, ``rate.py``)."""

    def sent_round(self, start: Start) -> None:
        """This run's message is sent round before it takes its lease (a pause, a rate's
        deferral): what was kept for its start is given on (a turn of a total)."""

    def take(self, start: Start) -> Lease | Contended | Kept:
        """Try once for the running lease: the key, taking over the message's own hold
        on it (queued, or reserved by the worker that received it). ``Kept``: the call
        waits for its turn in a waiting room (``takes_turns``)."""
        # A replaced message must not run even once the key is free again.
        unless = None if start.role else self.unless_replaced(start.queued)
        return start.store.try_acquire(
            start.name,
            start.ttl,
            token=start.token,
            take=start.take_over(unless_replaced=unless),
            entry=start.entry,
        )

    def replaced(self, held: Contended, start: Start, task_id: str) -> bool:
        """Whether the message of ``task_id`` whose take met ``held`` was replaced by a
        later call (it is then dropped quietly): as its refusal says."""
        return self.refusal.replaced(held, start.queued, start.token, task_id)

    def running(self, lease: Lease, start: Start) -> None:
        """The run holds ``lease`` (its own hold let go), before its renewal starts: what
        the lease watches for while the run goes on (``cancel.py``)."""

    def take_waiting(self, start: Start, waiting: LockStore, timeout: float | None) -> Lease:
        """Block up to ``timeout`` for the running lease (``on_contention=wait``)."""
        return waiting.acquire(
            start.name,
            start.ttl,
            timeout=timeout,
            token=start.token,
            take=start.take_over(),
            entry=start.entry,
        )

    # -- end --------------------------------------------------------------------------------

    @property
    def retry_keeps_key(self) -> bool:
        """Whether a failed run's retry holds the key until it runs (its message takes
        the running lease over); else the key is free at the failure and the retry
        contends when it comes, like a copy."""
        return "failure" not in self.reopen_on

    def ended(self, end: str, store: LockStore, request: object) -> None:
        """A run of ``request`` (its headers) ended so (``"failure"``, ``"revoked"``):
        when ``reopen_on`` names it, let the next call in now (``reopen``)."""
        if end in self.reopen_on:
            self.reopen(store, request)

    def reopen(self, store: LockStore, request: object) -> None:
        """Free what still keeps the next call out after the run's own lease is gone
        (nothing here: the key is free once the run ends)."""

    def release_held(self, store: LockStore, lease: Lease, *, eager: bool) -> list[Handed]:
        """What a run held besides its lease (``Start.held``), released as it ends; the
        calls whose turn came with it, to be sent."""
        if eager:
            store.release(lease)
        else:
            store.release_nowait(lease)
        return []

    def hand_out(self, store: LockStore, rooms: Collection[str]) -> list[Handed]:
        """A sweep's: free slots handed out to waiting calls (a dead run's, a lost
        reservation's) where this task's room is among ``rooms`` (those with calls); the
        calls whose turn came, to be sent."""
        return []

    def waiting(self, store: LockStore) -> dict[str, int]:
        """How many calls of each key wait for their turn (a waiting room's; {}: none)."""
        return {}

    @property
    def waiting_room(self) -> str | None:
        """The name of the waiting room this mode's calls wait in (``takes_turns``)."""
        return None

    def kept_calls(self, store: LockStore) -> dict[str, str]:
        """The calls kept in a waiting room, not handed their turn yet: ident -> key."""
        return {}

    def forget_turn(self, store: LockStore, ident: str) -> list[Handed]:
        """A call handed its turn that will never claim it (its message expired): the
        turn given on; the calls whose turn came instead, to be sent."""
        return []

    def also_held(self, name: str) -> list[str]:
        """The locks a run of ``name`` may hold besides its own, each released apart when
        its pool child dies (a ``total_limit``'s slots)."""
        return []

    def running_names(self, name: str, override: Override | None = None) -> list[str]:
        """Every lock a run of ``name`` may hold (itself; a counting lease's slots, as
        many as the code's limit or an operator's, the larger)."""
        return [name]

    def held_by_a_run(self, name: str) -> list[str]:
        """The locks a running copy holds as another worker would see them (test helpers)."""
        return self.running_names(name)

    # -- what an operator sees (``celery singleton``) --------------------------------------

    @classmethod
    def shows(cls, role: str | None, state: str) -> str | None:
        """How an operator sees the holder of a lock this mode writes beside a key
        (``role``), whose token says ``state``; None: not this mode's to say."""
        return None

    # -- what a new call would meet now (``celery singleton show``) ----------------------

    def new_call(self, held: Mapping[str | None, HolderRow]) -> str:
        """What a new call would get, given its lock's holders by role (None: the key's
        own); a refused one is answered as its refusal says."""
        hold = held.get(self.hold_role)
        said = self.refusal.new_call(hold)
        if said is not None:
            return said
        if hold is not None:
            answer = self.refusal.answers_duplicate
            return f"refused: a duplicate of {hold.task_id} ({hold.state}); {answer}"
        running = held.get(None)
        if running is not None:
            return f"accepted; runs after {running.task_id} ({running.state})"
        return "accepted"
