"""The S3 policy in ``docs/deploy.md`` is enough for everything objq does, and no more.

A moto S3 server in its own process enforces IAM (``/moto-api/reset-auth`` sets the number of
requests it lets through unchecked to 0, after the bucket and the user are made). The user has
exactly the policy the guide prints, read from the guide itself. Through its keys, a queue
enqueues, spills runs, keeps bodies out of line, claims, acks (the archive), dead-letters and
retries, takes a staged write, reads the archive and collects garbage; and a write outside the
prefix and a bucket-level action are refused.

moto checks actions and resources, not conditions: the ``s3:prefix`` condition of the listing
statement is not exercised here (moto let a listing of another prefix through).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from objq_broker import Queue
from objq_broker.engine.archive import iter_archive
from objq_broker.engine.garbage import collect_garbage
from objq_broker.errors import AccessDenied
from objq_broker.model.bodies import encode_bodies
from objq_broker.model.values import StagedBodies
from objq_broker.storage import ObjectStore, open_store
from tests.support.processes import Children
from tests.support.servers import free_port
from tests.support.waiting import wait_for

boto3 = pytest.importorskip("boto3")

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "deploy.md"
BUCKET, PREFIX = "jobs-bucket", "prod"
ADMIN = {"aws_access_key_id": "admin", "aws_secret_access_key": "admin"}


def documented_policy() -> dict[str, Any]:
    """The first JSON block of the guide's S3 section, for this test's bucket and prefix."""
    text = GUIDE.read_text()
    section = text[text.index("## S3 permissions") :]
    block = re.search(r"```json\n(.*?)```", section, re.DOTALL)
    assert block is not None, f"{GUIDE}: expected a ```json policy under '## S3 permissions'"
    policy = block.group(1).replace("YOUR-BUCKET", BUCKET).replace("YOUR-PREFIX", PREFIX)
    parsed: dict[str, Any] = json.loads(policy)
    return parsed


def as_moto_can_check(policy: dict[str, Any]) -> dict[str, Any]:
    """``policy`` in moto's (5.2) terms, for the listing only. moto checks a listing as the
    action ``s3:ListObjectsV2``, which AWS's IAM does not have (AWS checks ``s3:ListBucket``),
    and it evaluates conditions but never fills in ``s3:prefix`` from a listing, so it would
    refuse every listing. So a ``s3:ListBucket`` statement is given to moto under both names,
    without its ``s3:prefix`` condition (objq only lists under the prefix)."""
    statements = []
    for given in policy["Statement"]:
        statement = dict(given)
        if statement.get("Action") == "s3:ListBucket":
            condition = statement.pop("Condition", {}).get("StringLike", {})
            assert set(condition) == {"s3:prefix"}, given
            statement["Action"] = ["s3:ListBucket", "s3:ListObjectsV2"]
        statements.append(statement)
    return {**policy, "Statement": statements}


@pytest.fixture
def enforcing_moto(children: Children) -> Iterator[str]:
    """A moto server in a process of its own (its IAM switch is process-wide), not yet
    enforcing; yields its endpoint."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    children.start(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        quiet=True,
    )
    endpoint = f"http://127.0.0.1:{port}"

    def answering() -> bool:
        try:
            with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2):
                return True
        except OSError:
            return False

    wait_for(answering, 30, "moto server to answer")
    yield endpoint


def client(service: str, endpoint: str, **keys: str) -> Any:
    return boto3.client(service, endpoint_url=endpoint, region_name="us-east-1", **keys)


def user_with_documented_policy(endpoint: str) -> dict[str, str]:
    """Make the bucket and a user holding exactly the guide's policy; then turn enforcement
    on. Returns the user's keys."""
    client("s3", endpoint, **ADMIN).create_bucket(Bucket=BUCKET)
    iam = client("iam", endpoint, **ADMIN)
    iam.create_user(UserName="objq")
    iam.put_user_policy(
        UserName="objq",
        PolicyName="objq",
        PolicyDocument=json.dumps(as_moto_can_check(documented_policy())),
    )
    key = iam.create_access_key(UserName="objq")["AccessKey"]
    enforce = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth",
        data=b"0",  # requests let through unchecked from now on
        method="POST",
        headers={"Content-Type": "text/plain"},
    )
    with urllib.request.urlopen(enforce, timeout=10) as answer:
        assert answer.status == 200
    return {
        "aws_access_key_id": key["AccessKeyId"],
        "aws_secret_access_key": key["SecretAccessKey"],
    }


def store_as(endpoint: str, keys: dict[str, str], prefix: str = PREFIX) -> ObjectStore:
    # The user's own client: the tests' environment carries a session token of its own.
    return open_store(f"s3://{BUCKET}/{prefix}", client=client("s3", endpoint, **keys))


def test_the_documented_policy_runs_objq_and_refuses_the_rest(enforcing_moto: str) -> None:
    keys = user_with_documented_policy(enforcing_moto)
    store = store_as(enforcing_moto, keys)
    # Given a queue of that user: runs (spill_at=2) and out-of-line payloads (> 256 bytes)
    with Queue(store=store, broker="off", spill_at=2, gc_interval_seconds=None) as queue:
        queue.declare("q", max_attempts=1)
        payloads = [f"{n} ".encode() + b"x" * 300 for n in range(8)]
        for body in payloads:
            queue.enqueue("q", body)
        store.put("staging/w1/0-0-a-0.json", encode_bodies([("staged " + "y" * 300, False)]))
        queue.enqueue_staged("q", [StagedBodies("staging/w1/0-0-a-0.json", 1)], write_id="w1")
        # When it claims everything, acks all but one, dead-letters that one and retries it
        got = [d for d in queue.claim("q", 20)]
        assert len(got) == 9
        for delivery in got[1:]:
            queue.ack(delivery)
        assert queue.nack(got[0], error="boom", retry=False) == "dead"
        assert len(queue.retry_dead("q")) == 1
        (again,) = queue.claim("q", 5)
        queue.ack(again)
        queue.flush()
        assert queue.stats("q").ready == queue.stats("q").in_flight == 0
    # Then the archive reads back, and garbage collection lists, reads and deletes
    archived = {record.job.id for record in iter_archive(store)}
    assert {d.job.id for d in got} <= archived
    orphan = f"bodies/{uuid.uuid4().hex}.json"
    store.put(orphan, b"[]")
    collected = collect_garbage(store, now=time.time() + 7200)
    assert orphan in collected.keys and collected.failed == 0
    assert store.read(orphan) is None

    # And what the policy does not grant is refused: another prefix, the bucket itself
    with pytest.raises(AccessDenied):
        store_as(enforcing_moto, keys, prefix="other").write("state.json", b"{}")
    with pytest.raises(Exception, match="AccessDenied"):
        client("s3", enforcing_moto, **keys).delete_bucket(Bucket=BUCKET)
    with pytest.raises(Exception, match="AccessDenied"):
        client("s3", enforcing_moto, **keys).put_bucket_versioning(
            Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"}
        )
    store.close()
