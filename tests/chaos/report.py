"""Render a chaos run's figures (the JSON that CHAOS_RESULTS names) as docs/reliability.md.

    python -m tests.chaos.report RESULTS.json docs/reliability.md --command "..."

Every figure in the page is one the run printed; nothing here is typed in by hand.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.charts import timeline

SCENARIOS: list[tuple[str, str, str]] = [
    ("storm", "1. Storm",
     "Processes dispatch one key at one barrier: one message is published and every caller "
     "gets the same task id."),
    ("bypass_storm", "2. Bypass storm",
     "The same load through `send_task` (no dispatch check): executions of a key never "
     "overlap, fences rise, and the requeue policy runs every message once."),
    ("crash_child", "3a. Crash loop: pool child SIGKILLed",
     "At a random point of a running task; time until the key is free again "
     "(promise: 1 s, released by the worker's main process)."),
    ("crash_worker", "3b. Crash loop: whole worker SIGKILLed",
     "Main process and children at once; time until the key is free (promise: `ttl`)."),
    ("redis_restart", "4. Redis restart mid-run",
     "Persistence off, so every lock vanishes while tasks hold them: each in-flight "
     "holder learns it lost its lease, and the fenced store rejects its late write."),
    ("redis_down_fail_closed", "5a. Redis unreachable for 5 s, fail_closed",
     "Nothing runs unlocked, nothing is lost: every task runs after recovery."),
    ("redis_down_fail_open", "5b. Redis unreachable for 5 s, fail_open",
     "Tasks run unlocked during the outage and the worker log says so."),
    ("pause", "6. Pause (SIGSTOP) longer than ttl",
     "Another execution takes over; the resumed holder's fenced write is rejected and its "
     "`check()` raises."),
    ("partition_both", "7a. Partition: a holder cut off from the lock store",
     "A worker in its own network namespace loses its link to the lock store (nft drops "
     "both ways) while a run holds a renewed lease: the run learns it lost the lease "
     "(`on_lost`, then `check()` raises) before a worker outside takes the key with a "
     "greater fence, its late write is refused by the fenced store, and once healed the "
     "same worker renews leases again. No key is left."),
    ("partition_out", "7b. One-way partition: requests dropped",
     "As 7a with only the worker's packets to the lock store dropped."),
    ("partition_in", "7c. One-way partition: answers dropped",
     "As 7a with only the answers dropped: the renewals still land, so the key lives on "
     "until a ttl after the last one, and the successor starts later; the holder still "
     "learns first."),
    ("partition_short", "7d. Partition shorter than the lease",
     "Cut off for a third of the ttl: renewal fails, then resumes when the link heals; "
     "the run never lost its lease."),
    ("partition_waiter", "7e. A waiting run cut off",
     "A run waiting for its key (`on_contention=wait`, a BLPOP with no socket timeout) "
     "when the link drops: the wait ends by its own timeout plus a grace as an outage, "
     "fail_closed sends it again, and after the heal it runs once, never beside the "
     "holder."),
    ("partition_worker_fail_closed", "7f. Messages reach a cut-off worker, fail_closed",
     "None runs until the link heals; each runs once after."),
    ("partition_worker_fail_open", "7g. Messages reach a cut-off worker, fail_open",
     "Each runs unlocked at once and the log says so; none twice."),
    ("partition_dispatch_fail_closed", "7h. A producer cut off, fail_closed",
     "The producer reaches the broker but not the lock store (timeouts set to 1 s): each "
     "call is refused and publishes nothing; once healed the first call publishes and "
     "the rest get its result."),
    ("partition_dispatch_fail_open", "7i. A producer cut off, fail_open",
     "Each call publishes without the duplicate check; once healed the first call takes "
     "the key again; no message is published twice and the copies run one at a time."),
    ("partition_slow_link", "7j. A slow link",
     "The lock store 100 ms away each way (a relay; this kernel has no netem): leases "
     "of ten round trips hold while renewed, contending copies take turns."),
    ("clock_worker_step_+1h", "7k. A worker's wall clock steps forward an hour",
     "libfaketime moves the worker's wall clock mid-run (an NTP step): its renewed lease "
     "is kept (leases are timed on the monotonic clock), a run waiting for its key "
     "starts as the holder lets go, a 0.3 s wait still gives up in seconds, fences rise."),
    ("clock_worker_step_-1h", "7l. A worker's wall clock steps back an hour",
     "As 7k, an hour back."),
    ("clock_worker_slow", "7m. A worker's clock runs 0.5 % slow",
     "Every clock of the worker at 0.995 of real speed (libfaketime's rate) when it is "
     "cut off holding a lease: it still takes the lease as lost, by real time, before "
     "the server expires the key (leases end 1 % + 2 ms early on the local clock)."),
    ("clock_server_step_forward", "7n. The lock server's clock steps forward an hour",
     "Redis keeps absolute expiry times: every lease ends at once. The holder learns it "
     "at its next renewal (ttl/3) and the next holder's fence is still greater."),
    ("clock_server_step_back", "7o. The lock server's clock steps back an hour",
     "Every key lives an hour longer: a dead holder's lease blocks its key for an hour "
     "instead of `ttl` (until the clock is restored), and a holder that comes after "
     "an ended lease can get a smaller fence. Keep the server's clock slewed, never "
     "stepped (docs/topologies.md)."),
    ("soak", "8. Soak",
     "Mixed dispatch and `send_task` load on 20 keys with random child kills: no overlap, "
     "no fence regression, no key left after the drain, worker memory flat."),
    ("soak_green", "8b. Soak on a gevent pool",
     "The same load on two gevent workers, each SIGKILLed whole and replaced at random: "
     "tasks a killed worker held are lost (at most once: acked at start), none ever "
     "overlap, no key is left after the drain. Executions per second fall as the soak "
     "goes on because more and more of the 20 keys are held for messages that cannot run "
     "yet: the messages a killed worker had prefetched stay in the broker's unacked set "
     "for the visibility timeout (the test app's is an hour; `stuck_unacked`: unacked "
     "messages older than 10 s; `holds_of_messages_in_unacked` at the end)."),
    ("soak_green_visibility_10s", "8b'. Soak on a gevent pool, visibility timeout 10 s",
     "As 8b with `visibility_timeout` 10 s: a killed worker's prefetched messages come "
     "back 10-11 s later (every worker puts them back on its timer), their holds with "
     "them, and a message a killed worker had just taken off the queue is pushed again "
     "from its in-transit note: executions per second hold up over the ten minutes "
     "(the decline of 8b is the visibility timeout's, and that is the setting that "
     "bounds it)."),
    ("mode_soak_prefork", "8c. Every mode under kills",
     "A task of each mode (until_executing, replace, debounce, throttle, limit=2, "
     "rate=10/s, cancel), acks_late, and a plain task beside them, on two prefork workers "
     "whose pool children are SIGKILLed every 1-3 s and a whole worker every 10 s: no two "
     "runs of a key at once (`limit`: never more than 2), fences rise, a rate's slots "
     "never above 10 in any second, no key and no in-transit note left (a replaced "
     "call's record stays for `queue_ttl`, as its message may still be queued). No "
     "accepted singleton call is lost: a message taken off the queue by a worker killed "
     "before kombu recorded it as unacked is pushed again from its note "
     "(`pushed_again_after_lost_in_transit`); the plain task's calls are lost there (8e). "
     "`stale_unacked`: messages per second older than the visibility timeout, not yet "
     "put back."),
    ("mode_soak_gevent", "8d. Every mode on gevent workers killed whole",
     "As 8c on two gevent workers, one SIGKILLed whole every 3-5 s. A dead worker's "
     "unacked messages are put back within a second or two of their visibility timeout "
     "under full load (`stale_unacked`), as on prefork: before, a worker without an event "
     "loop put them back only when idle, and they piled up with their keys. `lost` "
     "counts the plain task's calls; each mode's own line says none of its were."),
    ("mode_soak_plain_control", "8e. The control: plain Celery, whole workers killed",
     "Plain tasks (no lock) on kombu's own transport, a whole prefork worker SIGKILLed "
     "every 2-4 s: calls taken off the queue by a worker killed before kombu recorded "
     "them are lost (celery/celery#7950), which singleton calls no longer are (8c)."),
    ("bad_input", "9. Bad input sweep",
     "Each case refused with an error naming the problem; nothing published, nothing left "
     "in Redis."),
    ("renewal_cost", "10a. What renewal costs, per ttl",
     "Leases renewed by one process's renewer every ttl/3, batched per node: renewals "
     "(EVALSHA) and round trips a second, and the CPU share of the client process and "
     "of redis-server, at 100 and 1,000 concurrent leases."),
    ("recovery", "10b. A key after its whole worker is SIGKILLed",
     "A run holds the key on one worker, its copy waits on a second (requeued with "
     "backoff); the first worker is SIGKILLed whole: seconds until the copy starts "
     "(promise: at most the ttl; at least two thirds of it, since the last renewal)."),
    ("redlock_master_lost", "11a. Redlock: a master killed or frozen under renewed leases",
     "Ten renewed leases (ttl 1.5 s) on 3 or 5 independent masters; a minority killed or "
     "SIGSTOPped for three ttls: every lease kept, others still refused, releases not "
     "held up by a frozen master, the next fence greater."),
    ("redlock_majority_lost", "11b. Redlock: a majority lost",
     "Two of three masters killed: a try is refused at once as the outage "
     "(`LockStoreUnavailableError`), the holder learns its lease is lost at its local "
     "expiry (when `check()` starts raising), and masters restarted empty grant a "
     "greater fence."),
    ("redlock_restart", "11c. Redlock: a master restarted without persistence",
     "The known hazard: a holder on a bare majority, one of whose masters comes back "
     "empty, is not alone any more (two holders). The second's fence is greater, so the "
     "fenced store refuses the first's late write, and the first learns at its next "
     "renewal."),
    ("redlock_clock_step", "11d. Redlock: one master's clock stepped",
     "libfaketime steps one master's clock an hour either way under a renewed lease: "
     "the lease is kept (the other two are a majority) and fences keep rising."),
]  # fmt: skip


def machine() -> str:
    cores = subprocess.run(["nproc"], capture_output=True, text=True, check=False).stdout.strip()
    redis_version = subprocess.run(
        ["redis-server", "--version"], capture_output=True, text=True, check=False
    ).stdout.split(" ")[2:3]
    return (
        f"{platform.system()} {platform.machine()}, {cores or '?'} cores, "
        f"Python {platform.python_version()}, redis-server {''.join(redis_version) or '?'}"
    )


def render(data: dict[str, Any], command: str, charts: dict[str, str] | None = None) -> str:
    """The page; with ``charts``, also the soak timelines (image path -> SVG) it shows."""
    results = data["results"]
    lines = [
        "# Reliability figures",
        "",
        "Generated by the chaos suite (`tests/chaos/`); regenerate with the command below.",
        "Every number is one the run printed. The checker (`tests/chaos/checker.py`, itself",
        "tested on logs with planted faults) reads an execution log kept outside the lock",
        "store.",
        "",
        f"- command: `{command}`",
        f"- scale: `{data['scale']}`",
        f"- date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {machine()}",
        "",
    ]
    for name, title, promise in SCENARIOS:
        figures = results.get(name)
        lines += [f"## {title}", "", promise, ""]
        if figures is None:
            lines += ["_Not run in this run._", ""]
            continue
        lines += ["| figure | value |", "|---|---|"]
        lines += [f"| {key} | {_shown(value)} |" for key, value in figures.items()
                  if key != "timeline"]  # fmt: skip
        for series, values in figures.get("timeline", {}).items():
            if series not in ("per_second", "kills"):  # sampled once a second
                lines.append(f"| {series}, per second | {_shown(values)} |")
        lines.append("")
        if "timeline" in figures and charts is not None:
            image = f"img/{name.replace('_', '-')}-timeline.svg"
            charts[image] = timeline(
                f"{title}: executions per second, kills marked",
                figures["timeline"]["per_second"], figures["timeline"]["kills"],
                label="executions ended per second", mark="a kill",
            )  # fmt: skip
            lines += [f"![{title}: executions per second and kills]({image})", ""]
    return "\n".join(lines)


def _shown(value: Any) -> str:
    """A figure for a table cell: a dict as ``key value`` pairs."""
    if isinstance(value, dict):
        return "; ".join(f"{key} {_shown(inner)}" for key, inner in value.items())
    return str(value)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("results")
    parser.add_argument("output")
    parser.add_argument("--command", default="python3 scripts/dev.py chaos")
    args = parser.parse_args()
    data = json.loads(Path(args.results).read_text())
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    charts: dict[str, str] = {}
    output.write_text(render(data, args.command, charts))
    for image, svg in charts.items():
        (output.parent / image).parent.mkdir(parents=True, exist_ok=True)
        (output.parent / image).write_text(svg)
    print(f"wrote {args.output} and {len(charts)} chart(s)")


if __name__ == "__main__":
    main()
