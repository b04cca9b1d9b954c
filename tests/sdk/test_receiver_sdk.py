"""The receiver SDK (promesa_receiver, its own distribution in sdk/): signature verification for both schemes,
idempotency claims on SQLite, PostgreSQL and Redis, and the per-resource ordering rule.

Real services only: PostgreSQL at 127.0.0.1:5432 (database ``test``, trust auth) and Redis
at 127.0.0.1:6379. Without them those tests skip, saying why; with CI=true they fail.
"""

from __future__ import annotations

import base64
import datetime as dt
import getpass
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from promesa_receiver import (
    Action,
    InMemoryOrderingStore,
    InvalidEvent,
    MalformedSignature,
    MissingSignature,
    RedisClaims,
    ResourceOrdering,
    SignatureMismatch,
    SqlClaims,
    SqlOrderingStore,
    TimestampOutsideTolerance,
    VerificationError,
    verify,
    verify_standard,
)
from promesa_receiver.signing import new_secret, promesa_header, promesa_v1, standard_headers, standard_signature

ROOT = Path(__file__).resolve().parents[2]
IN_CI = os.environ.get("CI", "").lower() == "true"
NOW = 1_800_000_000
BODY = b'{"id":"evt_1","type":"file.updated","version":1,"timestamp":"2027-01-15T08:00:00.000Z",' \
       b'"data":{"resource_id":"f_123","resource_version":7}}'
SECRET = "whsec_" + base64.b64encode(b"k" * 24).decode()
OLD_SECRET = "whsec_" + base64.b64encode(b"o" * 24).decode()
OTHER_SECRET = "whsec_" + base64.b64encode(b"x" * 24).decode()
THREADS = 12


def _unavailable(service: str, why: str):
    message = f"{service} is not reachable ({why})"
    if IN_CI:
        pytest.fail(f"CI=true and {message}: start it before running the suite", pytrace=False)
    pytest.skip(f"{message}; these tests need it")


def _all_at_once(n: int, work):
    """Run ``work(i)`` in n threads released together by a barrier; the results in order."""
    barrier = threading.Barrier(n)
    results: list = [None] * n
    errors: list = []

    def run(i):
        try:
            barrier.wait(timeout=30)
            results[i] = work(i)
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return results


# == promesa scheme: verify ===================================================================
def test_verify_accepts_a_good_signature_and_returns_the_timestamp():
    header = promesa_header([SECRET], NOW, BODY)
    assert verify(BODY, header, [SECRET], now=NOW) == NOW
    assert verify(bytearray(BODY), header, SECRET, now=NOW) == NOW  # one secret as a str


def test_verify_uses_the_clock_when_now_is_not_given():
    ts = int(time.time())
    assert verify(BODY, promesa_header(SECRET, ts, BODY), [SECRET]) == ts


def test_exception_hierarchy():
    for cls in (MissingSignature, MalformedSignature, TimestampOutsideTolerance, SignatureMismatch):
        assert issubclass(cls, VerificationError)
    assert issubclass(VerificationError, ValueError)


@pytest.mark.parametrize("header", [None, "", "   "])
def test_verify_rejects_a_missing_header(header):
    with pytest.raises(MissingSignature):
        verify(BODY, header, [SECRET], now=NOW)


GOOD_V1 = "v1=" + "a" * 64


@pytest.mark.parametrize("header, says", [
    ("garbage", "not key=value"),
    ("t=1800000000", "no v1"),
    (GOOD_V1, "exactly one t="),
    (f"t=abc,{GOOD_V1}", "not an integer"),
    (f"t=1800000000.5,{GOOD_V1}", "not an integer"),
    (f"t=-1800000000,{GOOD_V1}", "not an integer"),
    (f"t=01800000000,{GOOD_V1}", "not an integer"),
    (f"t=,{GOOD_V1}", "not key=value"),
    (f"t=1800000000,t=1800000001,{GOOD_V1}", "exactly one t="),
    ("t=1800000000,v1=xyz", "64 hex"),
    ("t=1800000000,v1=" + "a" * 63, "64 hex"),
    ("t=1800000000,v0=" + "a" * 64, "no v1"),
    (f"t=1800000000,{GOOD_V1},", "not key=value"),
    (f"t=1800000000;{GOOD_V1}", "not an integer"),
])
def test_verify_rejects_a_garbled_header(header, says):
    with pytest.raises(MalformedSignature, match=says):
        verify(BODY, header, [SECRET], now=NOW)


def test_verify_ignores_other_schemes_beside_v1():
    header = promesa_header([SECRET], NOW, BODY) + ",v0=deadbeef"
    assert verify(BODY, header, [SECRET], now=NOW) == NOW


def test_verify_accepts_uppercase_hex_and_spaces_after_commas():
    v1 = promesa_v1(SECRET, NOW, BODY).upper()
    assert verify(BODY, f"t={NOW}, v1={v1}", [SECRET], now=NOW) == NOW


@pytest.mark.parametrize("offset", [-300, 0, 300])
def test_verify_accepts_timestamps_inside_the_window(offset):
    header = promesa_header([SECRET], NOW + offset, BODY)
    assert verify(BODY, header, [SECRET], tolerance=300, now=NOW) == NOW + offset


@pytest.mark.parametrize("offset, says", [(-301, "in the past"), (-86400, "in the past"),
                                          (301, "in the future"), (86400, "in the future")])
def test_verify_rejects_timestamps_outside_the_window(offset, says):
    header = promesa_header([SECRET], NOW + offset, BODY)  # correctly signed, wrong time
    with pytest.raises(TimestampOutsideTolerance, match=says):
        verify(BODY, header, [SECRET], tolerance=300, now=NOW)


def test_verify_rejects_the_wrong_secret():
    with pytest.raises(SignatureMismatch):
        verify(BODY, promesa_header([OTHER_SECRET], NOW, BODY), [SECRET], now=NOW)


def test_verify_rejects_a_tampered_body():
    header = promesa_header([SECRET], NOW, BODY)
    with pytest.raises(SignatureMismatch):
        verify(BODY.replace(b'"resource_version":7', b'"resource_version":8'), header, [SECRET], now=NOW)
    with pytest.raises(SignatureMismatch):  # re-serialised JSON is different bytes
        verify(json.dumps(json.loads(BODY)).encode(), header, [SECRET], now=NOW)


def test_verify_rejects_a_signature_moved_to_another_timestamp():
    v1 = promesa_v1(SECRET, NOW - 1000, BODY)  # an old, valid signature under a fresh t
    with pytest.raises(SignatureMismatch):
        verify(BODY, f"t={NOW},v1={v1}", [SECRET], now=NOW)


def test_verify_rotation_two_v1_values_in_the_header():
    header = promesa_header([SECRET, OLD_SECRET], NOW, BODY)
    assert header.count("v1=") == 2
    assert verify(BODY, header, [OLD_SECRET], now=NOW) == NOW   # a receiver not yet rotated
    assert verify(BODY, header, [SECRET], now=NOW) == NOW       # a receiver already rotated
    with pytest.raises(SignatureMismatch):
        verify(BODY, header, [OTHER_SECRET], now=NOW)


def test_verify_rotation_two_secrets_on_the_receiver():
    for signed_with in (SECRET, OLD_SECRET):
        header = promesa_header([signed_with], NOW, BODY)
        assert verify(BODY, header, [SECRET, OLD_SECRET], now=NOW) == NOW


def test_verify_messages_never_contain_the_secret_or_the_expected_signature():
    expected = promesa_v1(SECRET, NOW, BODY)
    cases = [None, "garbage", promesa_header([SECRET], NOW - 999, BODY), promesa_header([OTHER_SECRET], NOW, BODY)]
    for header in cases:
        with pytest.raises(VerificationError) as info:
            verify(BODY, header, [SECRET], now=NOW)
        message = str(info.value)
        assert message and SECRET not in message and SECRET[6:] not in message and expected not in message


def test_verify_configuration_mistakes_are_not_verification_errors():
    header = promesa_header([SECRET], NOW, BODY)
    with pytest.raises(TypeError, match="raw request body"):
        verify(BODY.decode(), header, [SECRET], now=NOW)
    for secrets in ([], [""]):
        with pytest.raises(ValueError) as info:
            verify(BODY, header, secrets, now=NOW)
        assert not isinstance(info.value, VerificationError)
    with pytest.raises(ValueError):
        verify(BODY, header, [SECRET], tolerance=-1, now=NOW)


# == Standard Webhooks: verify_standard =======================================================
VECTOR_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
VECTOR_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
VECTOR_TS = 1614265330
VECTOR_BODY = b'{"test": 2432232314}'
VECTOR_SIG = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def _std(secrets=(SECRET,), msg_id="msg_1", ts=NOW, body=BODY):
    return standard_headers(list(secrets), msg_id, ts, body)


def test_standard_known_vector():
    assert standard_signature(VECTOR_SECRET, VECTOR_ID, VECTOR_TS, VECTOR_BODY) == VECTOR_SIG
    headers = {"webhook-id": VECTOR_ID, "webhook-timestamp": str(VECTOR_TS), "webhook-signature": VECTOR_SIG}
    assert verify_standard(VECTOR_BODY, headers, [VECTOR_SECRET], now=VECTOR_TS) == VECTOR_TS
    # and the reference implementation agrees on the vector
    wh = Webhook(VECTOR_SECRET)
    assert wh.sign(VECTOR_ID, dt.datetime.fromtimestamp(VECTOR_TS, dt.timezone.utc), VECTOR_BODY.decode()) == VECTOR_SIG


@pytest.mark.parametrize("secret", [VECTOR_SECRET, SECRET])
def test_standard_their_signature_our_verify(secret):
    body = '{"id":"evt_9","data":{"resource_id":"f_1"}}'
    ts = NOW + 17
    signature = Webhook(secret).sign("msg_theirs", dt.datetime.fromtimestamp(ts, dt.timezone.utc), body)
    headers = {"webhook-id": "msg_theirs", "webhook-timestamp": str(ts), "webhook-signature": signature}
    assert verify_standard(body.encode(), headers, [secret], now=ts) == ts
    with pytest.raises(SignatureMismatch):
        verify_standard(body.encode(), headers, [OTHER_SECRET], now=ts)


def test_standard_our_signature_their_verify():
    secret = new_secret()
    ts = int(time.time())  # the reference library checks against the real clock
    headers = standard_headers([secret], "msg_ours", ts, BODY)
    assert Webhook(secret).verify(BODY, headers) == json.loads(BODY)
    assert verify_standard(BODY, headers, [secret]) == ts
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(BODY + b" ", headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(OTHER_SECRET).verify(BODY, headers)


def test_standard_our_rotation_header_their_verify():
    ts = int(time.time())
    headers = standard_headers([SECRET, OLD_SECRET], "msg_rot", ts, BODY)
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (SECRET, OLD_SECRET):
        Webhook(secret).verify(BODY, headers)
        assert verify_standard(BODY, headers, [secret]) == ts


def test_standard_header_names_are_case_insensitive():
    headers = {k.title(): v for k, v in _std().items()}
    assert set(headers) == {"Webhook-Id", "Webhook-Timestamp", "Webhook-Signature"}
    assert verify_standard(BODY, headers, [SECRET], now=NOW) == NOW
    upper = {k.upper(): v for k, v in _std().items()}
    assert verify_standard(BODY, upper, [SECRET], now=NOW) == NOW


def test_standard_header_edge_cases():
    headers = {k.encode(): v.encode() for k, v in _std().items()}  # raw bytes, as some servers give them
    assert verify_standard(BODY, headers, [SECRET], now=NOW) == NOW
    conflicting = {**_std(), "Webhook-Id": "msg_other"}
    with pytest.raises(MalformedSignature, match="twice"):
        verify_standard(BODY, conflicting, [SECRET], now=NOW)


@pytest.mark.parametrize("drop", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_standard_rejects_a_missing_header(drop):
    headers = _std()
    del headers[drop]
    with pytest.raises(MissingSignature, match=drop):
        verify_standard(BODY, headers, [SECRET], now=NOW)
    headers[drop] = "  "
    with pytest.raises(MissingSignature, match=drop):
        verify_standard(BODY, headers, [SECRET], now=NOW)


@pytest.mark.parametrize("field, value, says", [
    ("webhook-timestamp", "abc", "not an integer"),
    ("webhook-timestamp", "1800000000.5", "not an integer"),
    ("webhook-timestamp", "-1800000000", "not an integer"),
    ("webhook-signature", "garbage", "not <version>,<base64>"),
    ("webhook-signature", "v1,", "not <version>,<base64>"),
    ("webhook-signature", "v1,!!!not-base64!!!", "not valid base64"),
    ("webhook-signature", "v1," + base64.b64encode(b"short").decode(), "not 32"),
    ("webhook-signature", "v1a,c29tZXRoaW5n", "no v1"),
    ("webhook-signature", "v2," + base64.b64encode(b"x" * 32).decode(), "no v1"),
])
def test_standard_rejects_garbled_headers(field, value, says):
    headers = _std()
    headers[field] = value
    with pytest.raises(MalformedSignature, match=says):
        verify_standard(BODY, headers, [SECRET], now=NOW)


def test_standard_ignores_other_versions_beside_v1():
    headers = _std()
    headers["webhook-signature"] = "v1a,c29tZXRoaW5n " + headers["webhook-signature"]
    assert verify_standard(BODY, headers, [SECRET], now=NOW) == NOW


@pytest.mark.parametrize("offset, says", [(-301, "in the past"), (301, "in the future")])
def test_standard_rejects_timestamps_outside_the_window(offset, says):
    with pytest.raises(TimestampOutsideTolerance, match=says):
        verify_standard(BODY, _std(ts=NOW + offset), [SECRET], tolerance=300, now=NOW)
    assert verify_standard(BODY, _std(ts=NOW + offset), [SECRET], tolerance=301, now=NOW) == NOW + offset


def test_standard_rejects_the_wrong_secret_and_a_tampered_body():
    with pytest.raises(SignatureMismatch):
        verify_standard(BODY, _std(secrets=[OTHER_SECRET]), [SECRET], now=NOW)
    with pytest.raises(SignatureMismatch):
        verify_standard(BODY + b"\n", _std(), [SECRET], now=NOW)
    headers = _std()
    headers["webhook-id"] = "msg_2"  # the id is signed too
    with pytest.raises(SignatureMismatch):
        verify_standard(BODY, headers, [SECRET], now=NOW)


def test_standard_rotation_two_v1_values_and_two_secrets():
    headers = _std(secrets=[SECRET, OLD_SECRET])
    assert verify_standard(BODY, headers, [OLD_SECRET], now=NOW) == NOW
    assert verify_standard(BODY, headers, [SECRET], now=NOW) == NOW
    for signed_with in (SECRET, OLD_SECRET):
        assert verify_standard(BODY, _std(secrets=[signed_with]), [SECRET, OLD_SECRET], now=NOW) == NOW
    with pytest.raises(SignatureMismatch):
        verify_standard(BODY, headers, [OTHER_SECRET], now=NOW)


def test_standard_messages_never_contain_the_secret():
    for headers in ({}, _std(ts=NOW - 999), _std(secrets=[OTHER_SECRET])):
        with pytest.raises(VerificationError) as info:
            verify_standard(BODY, headers, [SECRET], now=NOW)
        assert SECRET not in str(info.value) and SECRET[6:] not in str(info.value)


def test_standard_bad_secret_is_a_configuration_error():
    with pytest.raises(ValueError) as info:
        verify_standard(BODY, _std(), ["whsec_###"], now=NOW)
    assert not isinstance(info.value, VerificationError)
    assert "###" not in str(info.value)


# == services ===================================================================================
def _postgres_urls() -> list[str]:
    if os.environ.get("PROMESA_TEST_RECEIVER_POSTGRES"):
        return [os.environ["PROMESA_TEST_RECEIVER_POSTGRES"]]
    users = dict.fromkeys(["postgres", getpass.getuser()])
    return [f"postgresql+psycopg://{user}@127.0.0.1:5432/test" for user in users]


@pytest.fixture(scope="module")
def postgres_engine():
    reasons = []
    for url in _postgres_urls():
        engine = sa.create_engine(url, pool_size=THREADS + 2, connect_args={"connect_timeout": 2})
        try:
            with engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
        except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
            reasons.append(f"{url}: {str(exc).splitlines()[0]}")
            engine.dispose()
            continue
        yield engine
        engine.dispose()
        return
    _unavailable("PostgreSQL at 127.0.0.1:5432, database 'test'", "; ".join(reasons))


@pytest.fixture
def sqlite_engine(tmp_path):
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'receiver.db'}")
    yield engine
    engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def engine(request):
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_engine")
    return request.getfixturevalue("postgres_engine")


def _unique(name: str) -> str:
    return f"{name}_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def sql_claims(engine):
    claims = SqlClaims(engine, _unique("promesa_claims_test"))
    claims.create_table()
    claims.create_table()  # idempotent
    yield claims
    claims.drop_table()


@pytest.fixture
def redis_client():
    import redis

    client = redis.Redis(host="127.0.0.1", port=6379, socket_connect_timeout=2, socket_timeout=10)
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        client.close()
        _unavailable("Redis at 127.0.0.1:6379", str(exc))
    prefix = f"promesa:test:{uuid.uuid4().hex}:"
    client.test_prefix = prefix
    yield client
    keys = list(client.scan_iter(match=prefix + "*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


# == SqlClaims ===================================================================================
def test_sql_claims_first_claim_wins(sql_claims):
    assert sql_claims.claim("evt_1") is True
    assert sql_claims.claim("evt_1") is False
    assert sql_claims.claim("evt_1") is False
    assert sql_claims.claim("evt_2") is True
    with sql_claims.engine.connect() as conn:
        ids = conn.execute(sa.select(sql_claims.table.c.event_id).order_by(sql_claims.table.c.event_id)).scalars().all()
    assert ids == ["evt_1", "evt_2"]


def test_sql_claims_release_lets_a_retry_through(sql_claims):
    assert sql_claims.claim("evt_1")
    assert sql_claims.release("evt_1") is True
    assert sql_claims.release("evt_1") is False
    assert sql_claims.claim("evt_1") is True


def test_sql_claims_inside_a_transaction_roll_back_with_it(sql_claims):
    class WorkFailed(Exception):
        pass

    with pytest.raises(WorkFailed):
        with sql_claims.engine.begin() as conn:
            assert sql_claims.claim("evt_1", connection=conn) is True
            assert sql_claims.claim("evt_1", connection=conn) is False  # the transaction stays usable
            raise WorkFailed
    with sql_claims.engine.begin() as conn:
        assert sql_claims.claim("evt_1", connection=conn) is True
        conn.execute(sa.select(1))  # still usable after a duplicate
    assert sql_claims.claim("evt_1") is False


def test_sql_claims_concurrent_threads_exactly_one_wins(sql_claims):
    results = _all_at_once(THREADS, lambda i: sql_claims.claim("evt_race"))
    assert results.count(True) == 1, results
    assert results.count(False) == THREADS - 1


def test_sql_claims_concurrent_threads_in_transactions_exactly_one_wins(sql_claims):
    def work(i):
        with sql_claims.engine.begin() as conn:
            return sql_claims.claim("evt_race_tx", connection=conn)

    results = _all_at_once(THREADS, work)
    assert results.count(True) == 1, results


def test_sql_claims_from_a_url_and_bad_ids(tmp_path):
    claims = SqlClaims(f"sqlite:///{tmp_path / 'url.db'}")
    assert claims.table.name == "promesa_processed_events"
    claims.create_table()
    assert claims.claim("evt_1") and not claims.claim("evt_1")
    for bad in ("", None, "x" * 256):
        with pytest.raises(ValueError):
            claims.claim(bad)
    claims.engine.dispose()


# == RedisClaims =================================================================================
def test_redis_claims_first_claim_wins_with_a_ttl(redis_client):
    claims = RedisClaims(redis_client, prefix=redis_client.test_prefix, ttl_seconds=3600)
    assert claims.claim("evt_1") is True
    assert claims.claim("evt_1") is False
    assert claims.claim("evt_2") is True
    assert 0 < redis_client.ttl(claims.key("evt_1")) <= 3600
    assert redis_client.get(claims.key("evt_1")) == b"1"


def test_redis_claims_default_ttl_and_release(redis_client):
    claims = RedisClaims(redis_client, prefix=redis_client.test_prefix)
    assert claims.ttl_seconds == 7 * 86400
    assert claims.claim("evt_1")
    assert 7 * 86400 - 60 < redis_client.ttl(claims.key("evt_1")) <= 7 * 86400
    assert claims.release("evt_1") is True
    assert claims.release("evt_1") is False
    assert claims.claim("evt_1") is True


def test_redis_claims_concurrent_threads_exactly_one_wins(redis_client):
    claims = RedisClaims(redis_client, prefix=redis_client.test_prefix)
    results = _all_at_once(THREADS, lambda i: claims.claim("evt_race"))
    assert results.count(True) == 1, results


def test_redis_claims_reject_bad_arguments(redis_client):
    for ttl in (0, -5, 1.5, True):
        with pytest.raises(ValueError):
            RedisClaims(redis_client, ttl_seconds=ttl)
    with pytest.raises(ValueError):
        RedisClaims(redis_client, prefix=redis_client.test_prefix).claim("")


# == ordering ======================================================================================
def event(event_id, timestamp="2026-11-29T18:00:00.123Z", resource_id="f_123", resource_version=None,
          event_type="file.updated", **extra):
    data = {"resource_id": resource_id} if resource_id is not None else {}
    if resource_version is not None:
        data["resource_version"] = resource_version
    return {"id": event_id, "type": event_type, "version": 1, "timestamp": timestamp, "data": data, **extra}


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store(request):
    if request.param == "memory":
        yield InMemoryOrderingStore()
        return
    engine = request.getfixturevalue("sqlite_engine" if request.param == "sqlite" else "postgres_engine")
    sql = SqlOrderingStore(engine, _unique("promesa_events_test"), _unique("promesa_marks_test"))
    sql.create_tables()
    yield sql
    sql.drop_tables()


@pytest.fixture
def ordering(store):
    return ResourceOrdering(store)


def test_ordering_duplicates_are_detected_first(ordering, store):
    first = ordering.receive(event("evt_1", resource_version=7))
    assert first.action is Action.APPLY and first.should_apply
    again = ordering.receive(event("evt_1", resource_version=7))
    assert again.is_duplicate and not again.should_apply
    # a duplicate id is a duplicate even if its body differs; nothing about it is stored
    changed = ordering.receive(event("evt_1", resource_version=99))
    assert changed.is_duplicate
    assert store.get_mark("f_123").resource_version == 7
    assert store.get_event("evt_1").event.resource_version == 7


def test_ordering_older_after_newer_is_stored_but_not_applied_by_version(ordering, store):
    assert ordering.receive(event("evt_8", "2026-11-29T18:00:02.000Z", resource_version=8)).should_apply
    stale = ordering.receive(event("evt_7", "2026-11-29T18:00:01.000Z", resource_version=7))
    assert stale.action is Action.STALE and stale.is_stale
    assert stale.mark.event_id == "evt_8"
    stored = store.get_event("evt_7")
    assert stored is not None and stored.applied is False and stored.event.resource_version == 7
    assert store.get_event("evt_8").applied is True
    assert store.get_mark("f_123").event_id == "evt_8"
    assert ordering.receive(event("evt_7", "2026-11-29T18:00:01.000Z", resource_version=7)).is_duplicate


def test_ordering_older_after_newer_is_stale_by_timestamp(ordering, store):
    assert ordering.receive(event("evt_b", "2026-11-29T18:00:00.124Z")).should_apply
    stale = ordering.receive(event("evt_a", "2026-11-29T18:00:00.123Z"))
    assert stale.is_stale
    assert store.get_event("evt_a").applied is False
    assert store.get_mark("f_123").event_id == "evt_b"


def test_ordering_equal_timestamps_are_two_events_both_applied(ordering, store):
    same = "2026-11-29T18:00:00.123Z"
    first = ordering.receive(event("evt_x", same))
    second = ordering.receive(event("evt_y", same))
    assert first.should_apply and second.should_apply
    assert second.previous.event_id == "evt_x"
    assert store.get_event("evt_x").applied and store.get_event("evt_y").applied
    # the same instant written with another offset is the same timestamp
    third = ordering.receive(event("evt_z", "2026-11-29T19:00:00.123+01:00"))
    assert third.should_apply


def test_ordering_newer_arrivals_keep_applying(ordering, store):
    for n in range(1, 5):
        decision = ordering.receive(event(f"evt_{n}", f"2026-11-29T18:00:0{n}.000Z", resource_version=n))
        assert decision.should_apply
    assert store.get_mark("f_123").resource_version == 4


def test_ordering_version_decides_over_timestamp(ordering):
    assert ordering.receive(event("evt_8", "2026-11-29T18:00:05.000Z", resource_version=8)).should_apply
    # the producer's clock stepped back, but the version is newer: apply
    assert ordering.receive(event("evt_9", "2026-11-29T18:00:01.000Z", resource_version=9)).should_apply
    # an equal version is the state already applied, even with a later timestamp: stale
    assert ordering.receive(event("evt_9b", "2026-11-29T18:00:09.000Z", resource_version=9)).is_stale


def test_ordering_falls_back_to_timestamps_when_one_side_has_no_version(ordering):
    assert ordering.receive(event("evt_1", "2026-11-29T18:00:05.000Z")).should_apply
    assert ordering.receive(event("evt_2", "2026-11-29T18:00:04.000Z", resource_version=100)).is_stale
    assert ordering.receive(event("evt_3", "2026-11-29T18:00:05.000Z", resource_version=3)).should_apply


def test_ordering_resources_are_independent(ordering, store):
    assert ordering.receive(event("evt_a9", resource_id="f_a", resource_version=9)).should_apply
    assert ordering.receive(event("evt_b1", resource_id="f_b", resource_version=1)).should_apply
    assert ordering.receive(event("evt_a2", resource_id="f_a", resource_version=2)).is_stale
    assert store.get_mark("f_b").resource_version == 1


def test_ordering_events_without_a_resource_are_applied_once(ordering, store):
    assert ordering.receive(event("evt_ping", resource_id=None, event_type="ping")).should_apply
    assert ordering.receive(event("evt_ping", resource_id=None, event_type="ping")).is_duplicate
    assert store.get_event("evt_ping").applied is True


def test_ordering_ignores_the_envelope_version(ordering):
    assert ordering.receive(event("evt_1", resource_version=5) | {"version": 2}).should_apply
    assert ordering.receive(event("evt_2", resource_version=4) | {"version": 9}).is_stale


def test_ordering_stores_the_whole_body(ordering, store):
    body = event("evt_1", resource_version=3, extra_field={"nested": [1, 2]})
    ordering.receive(json.dumps(body).encode())  # raw JSON bytes are accepted too
    assert store.get_event("evt_1").event.payload == body


def test_ordering_receiving_rolls_back_when_applying_fails(ordering, store):
    class ApplyFailed(Exception):
        pass

    with pytest.raises(ApplyFailed):
        with ordering.receiving(event("evt_1", resource_version=1)) as decision:
            assert decision.should_apply
            raise ApplyFailed
    assert store.get_event("evt_1") is None and store.get_mark("f_123") is None
    with ordering.receiving(event("evt_1", resource_version=1)) as retry:
        assert retry.should_apply  # the retry is processed, not dropped as a duplicate
    assert store.get_event("evt_1").applied


def test_ordering_rejects_invalid_events(ordering):
    bad = [
        {"type": "file.updated", "timestamp": "2026-11-29T18:00:00Z"},                       # no id
        event("evt_1") | {"timestamp": None},
        {k: v for k, v in event("evt_1").items() if k != "timestamp"},                       # no timestamp
        event("evt_1", timestamp="2026-11-29T18:00:00"),                                     # no zone
        event("evt_1", timestamp="yesterday"),
        event("evt_1", resource_version="7"),
        event("evt_1", resource_version=True),
        event("evt_1") | {"data": [1]},
        event("evt_1", resource_id=123),
        b"not json",
    ]
    for body in bad:
        with pytest.raises(InvalidEvent):
            ordering.receive(body)


def test_ordering_in_the_callers_transaction(engine):
    store = SqlOrderingStore(engine, _unique("promesa_events_test"), _unique("promesa_marks_test"))
    store.create_tables()
    try:
        ordering = ResourceOrdering(store)
        with pytest.raises(RuntimeError):
            with engine.begin() as conn:
                assert ordering.receive(event("evt_1", resource_version=1), connection=conn).should_apply
                assert ordering.receive(event("evt_1", resource_version=1), connection=conn).is_duplicate
                raise RuntimeError("the application's own work failed")
        assert store.get_event("evt_1") is None
        with engine.begin() as conn:
            assert ordering.receive(event("evt_1", resource_version=1), connection=conn).should_apply
            assert ordering.receive(event("evt_0", resource_version=0), connection=conn).is_stale
        assert store.get_mark("f_123").event_id == "evt_1"
        assert store.get_event("evt_0").applied is False
    finally:
        store.drop_tables()


def test_ordering_concurrent_duplicates_exactly_one_applies(ordering):
    results = _all_at_once(THREADS, lambda i: ordering.receive(event("evt_same", resource_version=1)).action)
    assert results.count(Action.APPLY) == 1, results
    assert results.count(Action.DUPLICATE) == THREADS - 1


def test_ordering_concurrent_versions_of_a_new_resource(ordering, store):
    def work(i):
        return ordering.receive(event(f"evt_v{i}", resource_id="f_new", resource_version=i)).action

    results = _all_at_once(THREADS, work)
    assert Action.DUPLICATE not in results
    assert results[THREADS - 1] is Action.APPLY  # the newest always wins
    assert store.get_mark("f_new").resource_version == THREADS - 1
    for i in range(THREADS):
        stored = store.get_event(f"evt_v{i}")
        assert stored is not None and stored.applied == (results[i] is Action.APPLY)


# == import without the optional libraries =========================================================
def test_import_needs_only_the_standard_library(tmp_path):
    code = textwrap.dedent("""
        import sys
        for name in ("flask", "sqlalchemy", "redis"):
            sys.modules[name] = None          # any import of them raises ImportError
        import promesa_receiver as receiver
        from promesa_receiver.signing import promesa_header, standard_headers

        body = b'{"id":"evt_1"}'
        assert receiver.verify(body, promesa_header(["whsec_c2VjcmV0"], 1000, body), ["whsec_c2VjcmV0"], now=1000) == 1000
        headers = standard_headers(["whsec_c2VjcmV0"], "msg_1", 1000, body)
        assert receiver.verify_standard(body, headers, ["whsec_c2VjcmV0"], now=1000) == 1000
        decision = receiver.ResourceOrdering().receive(
            {"id": "evt_1", "timestamp": "2026-11-29T18:00:00.123Z", "data": {"resource_id": "f_1"}})
        assert decision.should_apply
        try:
            receiver.SqlClaims("sqlite://")
        except ImportError as exc:
            assert "SQLAlchemy" in str(exc), exc
        else:
            raise AssertionError("SqlClaims built without SQLAlchemy")
        heavy = sorted(m for m, mod in sys.modules.items()
                       if mod is not None
                       and m.split(".")[0] in {"dashboard", "flask", "werkzeug", "sqlalchemy", "redis", "jinja2"})
        assert not heavy, heavy
        print("ok")
    """)
    # Run outside the repository: what imports is the installed promesa-receiver distribution.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_the_sdk_distribution_requires_nothing_beyond_the_standard_library():
    from importlib.metadata import requires

    required = requires("promesa-receiver") or []
    assert all("extra ==" in r for r in required), required  # SQLAlchemy only as the optional "sql" extra
    assert any(r.startswith("sqlalchemy") and 'extra == "sql"' in r for r in required), required
    assert any(r.startswith("promesa-receiver") for r in requires("promesa")), "the service depends on the SDK"

