"""A receiver on 127.0.0.1 whose every path answers what the test says: up (200), down (503), failing (400)."""

from __future__ import annotations

import json

from .receiver import Receiver


class SwitchableReceiver(Receiver):
    def __init__(self, status: int = 200):
        super().__init__()
        self.status = status
        self.answers: list[int] = []  # what each request got, in order

    def behaviour(self, path: str, n: int) -> tuple[int, dict]:
        self.answers.append(self.status)
        return self.status, {}

    def accepted(self) -> list:
        """The requests answered 2xx, in order: what the other side really received."""
        with self.lock:
            return [r for r, status in zip(self.requests, self.answers) if 200 <= status < 300]

    def accepted_json(self) -> list[dict]:
        return [json.loads(r.body) for r in self.accepted()]
