"""The ``objq`` executable against a local directory and moto's S3 server: outputs (``--json``
parsed), exit codes, confirmations, and the state each command leaves behind."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

from objq_broker import Queue
from objq_broker.results.store import ResultStore
from objq_broker.storage import open_store
from tests.cli.objq_cli import Objq, environment, objq_command
from tests.support.processes import Children, reap


def test_declare_enqueue_inspect_and_configure(objq: Objq, cli_url: str, tmp_path: Path) -> None:
    # Given a queue declared with settings
    created = objq(
        "declare", "mail", "--max-attempts", "4", "--lease", "90s", "--json", url=cli_url
    )
    assert created.code == 0, created.stderr
    assert created.json()["created"] is True
    assert created.json()["config"]["max_attempts"] == 4
    assert created.json()["config"]["lease_seconds"] == 90.0

    # When jobs are enqueued one at a time, delayed, and from a JSON-lines file
    one = objq("enqueue", "mail", "hello", "--priority", "-1", "--json", url=cli_url)
    assert one.code == 0, one.stderr
    [job_id] = one.json()["ids"]
    later = objq("enqueue", "mail", "later", "--delay", "1h", url=cli_url)
    assert later.code == 0 and len(later.stdout.strip()) == 32
    lines = tmp_path / "jobs.jsonl"
    lines.write_text('{"to": "ada"}\n\n{"to": "bob"}\n')
    bulk = objq("enqueue", "mail", "--jsonl", str(lines), "--json", url=cli_url)
    assert bulk.code == 0, bulk.stderr
    assert bulk.json()["enqueued"] == 2

    # Then status, jobs and config show them
    status = objq("status", "--json", url=cli_url).json()
    [mail] = status["queues"]
    assert (mail["ready"], mail["delayed"], mail["in_flight"], mail["dead"]) == (3, 1, 0, 0)
    assert status["version"] >= 4 and status["size_bytes"] > 0
    assert abs(status["committed_at"] - time.time()) < 60
    table = objq("status", url=cli_url)
    assert table.code == 0 and "IN FLIGHT" in table.stdout and "mail" in table.stdout

    listed = objq("jobs", "list", "mail", "--json", url=cli_url).json()
    assert [row["payload"] for row in listed[:3]] == ["hello", '{"to": "ada"}', '{"to": "bob"}']
    assert listed[3]["state"] == "delayed"
    ready = objq("jobs", "list", "mail", "--state", "ready", "--limit", "1", "--json", url=cli_url)
    assert [row["id"] for row in ready.json()] == [job_id]
    shown = objq("jobs", "show", job_id, "--json", url=cli_url).json()
    assert (shown["payload"], shown["priority"], shown["state"]) == ("hello", -1, "ready")

    # A payload over 256 bytes is kept out of the state, and still shown whole
    large = "x" * 300 + "é"
    big = objq("enqueue", "mail", large, "--priority", "5", "--json", url=cli_url)
    [big_id] = big.json()["ids"]
    assert objq("jobs", "show", big_id, "--json", url=cli_url).json()["payload"] == large
    last = objq("jobs", "list", "mail", "--state", "ready", "--json", url=cli_url).json()[-1]
    assert (last["id"], last["payload"]) == (big_id, large)

    changed = objq("config", "set", "mail", "backoff-base", "2.5", "--json", url=cli_url)
    assert changed.code == 0, changed.stderr
    assert changed.json()["config"]["backoff_base_seconds"] == 2.5
    config = objq("config", "show", "mail", "--json", url=cli_url).json()
    assert config["mail"]["backoff_base_seconds"] == 2.5
    assert config["mail"]["max_attempts"] == 4


def test_bulk_enqueue_commits_in_batches(objq: Objq, file_url: str, tmp_path: Path) -> None:
    lines = tmp_path / "payloads.txt"
    lines.write_text("".join(f"payload {i}\n" for i in range(2500)))
    assert objq("declare", "bulk", url=file_url).code == 0
    before = objq("status", "--json", url=file_url).json()["version"]

    done = objq("enqueue", "bulk", "--file", str(lines), "--batch", "1000", "--json", url=file_url)

    assert done.code == 0, done.stderr
    assert done.json()["enqueued"] == 2500 and len(set(done.json()["ids"])) == 2500
    after = objq("status", "--json", url=file_url).json()
    assert after["version"] - before == 3  # 1000 + 1000 + 500: one commit each
    assert after["queues"][0]["ready"] == 2500
    first = objq("jobs", "list", "bulk", "--limit", "1", "--json", url=file_url).json()
    assert first[0]["payload"] == "payload 0"


def test_destructive_commands_ask_first(objq: Objq, file_url: str) -> None:
    for payload in ("a", "b"):
        assert objq("enqueue", "q", payload, url=file_url).code == 0
    state = Path(file_url.removeprefix("file://")) / "state.json"
    original = state.read_bytes()

    # No terminal and no --yes: refused, nothing changed
    refused = objq("purge", "q", url=file_url)
    assert refused.code == 2
    assert "stdin is not a terminal" in refused.stderr and "--yes" in refused.stderr
    assert state.read_bytes() == original

    # A terminal answering no: cancelled
    declined = objq("purge", "q", url=file_url, tty_answer="n")
    assert declined.code == 1, declined.stderr
    assert "delete the 2 ready and delayed jobs of queue 'q'" in declined.stderr
    assert "cancelled" in declined.stderr
    assert state.read_bytes() == original

    # A terminal answering yes: purged
    accepted = objq("purge", "q", "--json", url=file_url, tty_answer="yes")
    assert accepted.code == 0, accepted.stderr
    assert accepted.json() == {"queue": "q", "purged": 2}
    assert objq("status", "--json", url=file_url).json()["queues"][0]["ready"] == 0


def test_queue_delete_asks_first_then_removes_the_queue_and_all_its_jobs(
    objq: Objq, file_url: str
) -> None:
    # Given a queue with a ready job and a dead letter, beside another queue
    for queue, payload in (("doomed", "a"), ("doomed", "b"), ("kept", "c")):
        assert objq("enqueue", queue, payload, url=file_url).code == 0
    with Queue(file_url) as client:
        [delivery] = client.claim("doomed", 1)
        client.nack(delivery, error="no", retry=False)

    # When deletion is declined: nothing changes
    declined = objq("queue", "delete", "doomed", url=file_url, tty_answer="n")
    assert declined.code == 1, declined.stderr
    assert "delete queue 'doomed', its settings and its 2 jobs (0 in flight, 1 dead)" in (
        declined.stderr
    )
    assert {q["queue"] for q in objq("status", "--json", url=file_url).json()["queues"]} == {
        "doomed",
        "kept",
    }

    # When it is confirmed: the queue and both jobs are gone, the other queue is untouched
    done = objq("queue", "delete", "doomed", "--yes", "--json", url=file_url)
    assert done.code == 0, done.stderr
    assert done.json() == {"queue": "doomed", "deleted_jobs": 2}
    queues = objq("status", "--json", url=file_url).json()["queues"]
    assert [(q["queue"], q["ready"]) for q in queues] == [("kept", 1)]

    # And a queue that does not exist is an error, not a silent success
    missing = objq("queue", "delete", "doomed", "--yes", url=file_url)
    assert missing.code == 1
    assert "doomed" in missing.stderr and len(missing.stderr.strip().splitlines()) == 1


def test_dead_letters_list_retry_purge(objq: Objq, file_url: str) -> None:
    # Given three jobs that died on their only attempt (the worker runs `false`)
    assert objq("declare", "jobs", "--max-attempts", "1", url=file_url).code == 0
    for _ in range(3):
        assert objq("enqueue-cmd", "jobs", "--", "false", url=file_url).code == 0
    ran = objq("worker", "--queue", "jobs", "--burst", "--json", url=file_url)
    assert ran.code == 0, ran.stderr
    assert ran.json_lines()[-1]["dead"] == 3
    dead = objq("dead", "list", "jobs", "--json", url=file_url).json()
    assert len(dead) == 3 and all(row["error"] == "exit code 1" for row in dead)
    header, *rows = objq("dead", "list", "jobs", url=file_url).stdout.splitlines()
    assert header.split()[:4] == ["ID", "STATE", "PRI", "DELIVERIES"]
    assert all(" 1 of 1 " in row for row in rows)  # delivered once, of at most once

    # When one is retried and the others purged
    usage = objq("dead", "retry", "jobs", url=file_url)
    assert usage.code == 2 and "job ids or --all" in usage.stderr
    retried = objq("dead", "retry", "jobs", dead[0]["id"], "--json", url=file_url)
    assert retried.code == 0 and retried.json()["retried"] == [dead[0]["id"]]
    unknown = objq("dead", "retry", "jobs", "nope", url=file_url)
    assert unknown.code == 1 and "no dead letters with ids ['nope']" in unknown.stderr
    purged = objq("dead", "purge", "jobs", "--all", "--yes", "--json", url=file_url)
    assert purged.code == 0 and purged.json()["purged"] == 2

    # Then the retried one is ready with fresh attempts, and no dead letter is left
    [status] = objq("status", "--json", url=file_url).json()["queues"]
    assert (status["ready"], status["dead"]) == (1, 0)
    job = objq("jobs", "show", dead[0]["id"], "--json", url=file_url).json()
    assert (job["state"], job["attempts"]) == ("ready", 0)


def test_archive_list_and_cat(objq: Objq, file_url: str) -> None:
    assert objq("declare", "arch", "--max-attempts", "1", url=file_url).code == 0
    assert objq("enqueue-cmd", "arch", "--", "true", url=file_url).code == 0
    assert objq("enqueue-cmd", "arch", "--", "false", url=file_url).code == 0
    assert objq("worker", "--queue", "arch", "--burst", url=file_url).code == 0

    # Two small records: the state keeps them in its archive tail, not yet an object
    keys = objq("archive", "list", "--since", "1h", "--json", url=file_url)
    assert keys.code == 0, keys.stderr
    [tail] = keys.json()
    assert (tail["key"], tail["tail_records"]) == ("state.json", 2)
    shown = objq("archive", "list", "--since", "1h", url=file_url).stdout
    assert "state.json" in shown and "the state's tail: 2 records" in shown
    assert objq("status", "--json", url=file_url).json()["archive_tail_records"] == 2
    assert "archive tail: 2 finished jobs" in objq("status", url=file_url).stdout
    records = objq("archive", "cat", "--since", "1h", "--queue", "arch", url=file_url)
    assert records.code == 0, records.stderr
    outcomes = sorted(
        (r["state"], json.loads(r["payload"])["argv"][0]) for r in records.json_lines()
    )
    assert outcomes == [("dead", "false"), ("done", "true")]
    future = objq("archive", "cat", "--since", "2999-01-01T00:00", url=file_url)
    assert future.code == 0 and future.stdout == ""
    backwards = objq("archive", "list", "--since", "1h", "--until", "2h", url=file_url)
    assert backwards.code == 2 and "must be later than --since" in backwards.stderr


def test_requeue_stale_returns_expired_leases(objq: Objq, file_url: str) -> None:
    assert objq("declare", "stale", "--lease", "0.2", url=file_url).code == 0
    assert objq("enqueue", "stale", "x", url=file_url).code == 0
    with Queue(file_url) as queue:  # a worker that claims and vanishes
        [delivery] = queue.claim("stale")
    assert objq("status", "--json", url=file_url).json()["queues"][0]["in_flight"] == 1
    time.sleep(0.3)  # kept: the lease running out is what this test is about

    requeued = objq("requeue-stale", "--json", url=file_url)

    assert requeued.code == 0 and requeued.json() == {"requeued": 1}
    job = objq("jobs", "show", delivery.id, "--json", url=file_url).json()
    assert job["state"] == "ready" and job["error"] == "lease expired on attempt 1"


def test_demo_and_its_module_alias(objq: Objq, tmp_path: Path) -> None:
    # `objq demo` defaults to ./objq-data
    shown = objq("demo", "--jobs", "400", url=None, cwd=tmp_path)
    assert shown.code == 0, shown.stderr
    assert "QUEUE" in shown.stdout and "jobs/s with 4 worker threads" in shown.stdout
    assert (tmp_path / "objq-data" / "state.json").exists()

    url = (tmp_path / "other").as_uri()
    result = objq("demo", "--jobs", "300", "--workers", "2", "--url", url, "--json", url=None)
    assert result.code == 0, result.stderr
    summary = result.json()
    assert summary["done"] + summary["dead"] == summary["jobs"] == 300
    assert summary["dead"] == 3 and summary["retried"] == 3 * 2 + 3
    [demo] = summary["status"]["queues"]
    assert (demo["ready"], demo["delayed"], demo["in_flight"], demo["dead"]) == (0, 0, 0, 3)


def test_demo_help_names_its_own_default(objq: Objq) -> None:
    # The demo empties its queue, so it never uses $OBJQ_URL; its help must not promise it
    helped = objq("demo", "--help", url=None)
    assert helped.code == 0, helped.stderr
    text = " ".join(helped.stdout.split())  # click wraps the help text
    assert "--url URL store URL (default: ./objq-data;" in text
    assert "default: $OBJQ_URL" not in text

    # Every other command still defaults to $OBJQ_URL
    other = " ".join(objq("status", "--help", url=None).stdout.split())
    assert "--url URL store URL (default: $OBJQ_URL)" in other


def test_status_watch_refreshes_until_interrupted(file_url: str, children: Children) -> None:
    declared = subprocess.run(
        [*objq_command(), "declare", "w"], check=False, env=environment(file_url)
    )
    assert declared.returncode == 0
    process = children.adopt(
        subprocess.Popen(
            [*objq_command(), "status", "--watch", "0.1", "--json"],
            stdout=subprocess.PIPE,
            text=True,
            env=environment(file_url),
            # A shell runs background jobs with Ctrl-C ignored, and a child inherits that: give
            # this one the terminal's default, as a user's own `objq status --watch` has.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509
        )
    )
    assert process.stdout is not None
    first, second = process.stdout.readline(), process.stdout.readline()
    children.send_signal(process, signal.SIGINT)
    assert reap(process) == 0
    assert json.loads(first)["queues"][0]["queue"] == "w"
    assert json.loads(second)["read_at"] > json.loads(first)["read_at"]


def test_results_purge_deletes_expired_results_then_old_ones_when_told(
    objq: Objq, cli_url: str
) -> None:
    results = ResultStore(open_store(cli_url))
    results.set("gone", b"1", ttl=0.01)
    results.set("kept", b"2", ttl=None)
    time.sleep(0.05)
    # A Celery result backend's URL (objq+...) names the same store
    done = objq("results", "purge", "--json", url=f"objq+{cli_url}")
    assert done.code == 0, done.stderr
    assert json.loads(done.stdout) == {"deleted": 1, "prefix": "results/"}
    assert results.names() == ["kept"]
    # Deleting results that have not expired asks first
    refused = objq("results", "purge", "--older-than", "0s", url=cli_url, tty_answer="n")
    assert refused.code != 0 and results.names() == ["kept"]
    done = objq("results", "purge", "--older-than", "0s", "-y", url=cli_url)
    assert done.code == 0 and "1 result deleted" in done.stdout
    assert results.names() == []


def test_jsonl_lines_name_their_group_by_a_field_in_order_and_in_one_commit(
    objq: Objq, file_url: str, tmp_path: Path
) -> None:
    lines = tmp_path / "jobs.jsonl"
    lines.write_text('{"t": "a", "n": 1}\n{"t": "a", "n": 2}\n{"t": "b", "n": 3}\n{"n": 4}\n')
    assert objq("declare", "q", url=file_url).code == 0
    before = objq("status", "--json", url=file_url).json()["version"]

    done = objq("enqueue", "q", "--jsonl", str(lines), "--group-field", "t", url=file_url)
    one = objq("enqueue", "q", "solo", "--group", "c", url=file_url)

    assert (done.code, one.code) == (0, 0), done.stderr + one.stderr
    listed = objq("jobs", "list", "q", "--json", url=file_url).json()
    shown = [(job["payload"], job["group"]) for job in listed]
    assert shown == [
        ('{"t": "a", "n": 1}', "a"), ('{"t": "a", "n": 2}', "a"), ('{"t": "b", "n": 3}', "b"),
        ('{"n": 4}', None), ("solo", "c"),
    ]  # fmt: skip
    status = objq("status", "--json", url=file_url).json()
    assert status["version"] - before == 2
    [queue] = status["queues"]
    busiest = [(g["group"], g["ready"], g["in_flight"]) for g in queue["busiest_groups"]]
    assert (queue["groups"], busiest) == (3, [("a", 2, 0), ("b", 1, 0), ("c", 1, 0)])
    text = objq("status", url=file_url).stdout
    assert "GROUPS" in text and "busiest groups of q: a (2 ready, 0 in flight" in text


def test_group_settings_by_declare_and_config_set_and_shown_for_every_queue(
    objq: Objq, file_url: str
) -> None:
    assert objq("declare", "plain", url=file_url).code == 0
    declared = objq("declare", "tenants", "--group-concurrency", "1", "--json", url=file_url)
    assert declared.code == 0, declared.stderr
    assert objq("config", "set", "tenants", "fairness", "off", url=file_url).code == 0
    config = objq("config", "show", "--json", url=file_url).json()
    groups = {name: (c["group_concurrency"], c["fairness"]) for name, c in config.items()}
    assert groups == {"plain": (None, True), "tenants": (1, False)}
    lifted = objq("config", "set", "tenants", "group-concurrency", "none", url=file_url)
    assert lifted.code == 0 and "group_concurrency = none" in lifted.stdout
    assert (
        objq("config", "show", "tenants", "--json", url=file_url).json()["tenants"][
            "group_concurrency"
        ]
        is None
    )
    refused = objq("config", "set", "tenants", "fairness", "maybe", url=file_url)
    assert refused.code == 2 and "fairness: expected on or off, found 'maybe'" in refused.stderr
    shown = objq("config", "show", url=file_url)
    assert shown.code == 0 and "group_concurrency" in shown.stdout, shown.stderr


def test_status_counts_the_jobs_finished_in_the_last_hour_by_outcome(
    objq: Objq, file_url: str
) -> None:
    # Given jobs acked done, acked as failed (a framework settling a failure itself) and
    # dead-lettered, some archived as objects (a tail of 0 bytes writes one per commit) and
    # some kept in the state's archive tail, beside a queue with a job still in flight
    for url in (f"{file_url}?archive_tail_bytes=0", file_url):
        with Queue(url) as queue:
            queue.declare("counted", max_attempts=1)
            queue.enqueue_many("counted", [b"%d" % n for n in range(6)])
            deliveries = queue.claim("counted", 6)
            for delivery in deliveries[:3]:
                queue.ack(delivery)
            for delivery in deliveries[3:5]:
                queue.ack(delivery, outcome="failed", error="boom")
            queue.nack(deliveries[5], error="no", retry=False)
            queue.enqueue("busy", b"x")
            queue.claim("busy")
    archive = Path(file_url.removeprefix("file://")) / "archive"
    assert list(archive.rglob("*.jsonl")), "some records are in archive objects"

    # When the status is read
    status = objq("status", "--json", url=file_url)
    shown = objq("status", url=file_url)

    # Then each queue counts its finished jobs once each, by outcome
    assert status.code == 0, status.stderr
    counts = {q["queue"]: q["last_hour"] for q in status.json()["queues"]}
    assert counts == {
        "counted": {"done": 6, "failed": 4, "dead": 2},
        "busy": {"done": 0, "failed": 0, "dead": 0},
    }
    lines = shown.stdout.splitlines()
    [header] = [line for line in lines if line.startswith("QUEUE")]
    assert header.split()[-6:] == ["DONE", "1H", "FAILED", "1H", "DEAD", "1H"]
    [counted] = [line for line in lines if line.startswith("counted ")]
    assert counted.split()[-3:] == ["6", "4", "2"]
