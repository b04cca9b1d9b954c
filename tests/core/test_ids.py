"""Public ids: ULIDs that any ULID library reads back, increasing in the order they were made."""

from __future__ import annotations

import time

import pytest
from ulid import ULID

from dashboard.core import ids


def test_ids_are_ulids_of_now_with_their_prefix():
    before = time.time()
    made = ids.new_ids("dlv", 3) + [ids.new_id("evt")]
    after = time.time()
    assert [i[:4] for i in made] == ["dlv_", "dlv_", "dlv_", "evt_"]
    for made_id in made:
        ulid = ULID.from_str(made_id[4:])  # python-ulid decodes it, and encodes it back the same
        assert str(ulid) == made_id[4:]
        assert before - 0.001 <= ulid.timestamp <= after + 0.001


def test_ids_increase_in_the_order_they_are_made():
    made = [ids.new_id("x") for _ in range(5000)] + ids.new_ids("x", 500) + [ids.new_id("x")]
    assert made == sorted(made) and len(set(made)) == len(made)


def test_ids_keep_increasing_when_the_clock_steps_back(monkeypatch):
    first = ids.new_id("x")
    real = time.time_ns
    monkeypatch.setattr(ids.time, "time_ns", lambda: real() - 60_000_000_000)
    assert ids.new_ids("x", 3)[0] > first


def test_a_full_millisecond_moves_to_the_next(monkeypatch):
    now_ms = time.time_ns() // 1_000_000
    monkeypatch.setattr(ids, "_last", (now_ms + 1000, ids._RANDOM_LIMIT - 2))  # nearly out of random values
    made = ids.new_ids("x", 3)
    assert made == sorted(made)
    assert {ULID.from_str(i[2:]).milliseconds for i in made} == {now_ms + 1001}


@pytest.mark.parametrize("count", [0, -1])
def test_no_ids_for_nothing(count):
    assert ids.new_ids("x", count) == []
