"""A consumer portal session for tests: the producer asks for a link, a client opens it."""

from __future__ import annotations

from urllib.parse import urlsplit


def link_path(producer, uid: str, expires_in: int | None = None) -> str:
    """The path of a new portal link for `uid` (asked for with the producer's token)."""
    resp = producer.post(f"/api/v1/consumers/{uid}/portal-links",
                         {} if expires_in is None else {"expires_in": expires_in})
    assert resp.status_code == 201, resp.get_json()
    return urlsplit(resp.get_json()["url"]).path


def open_portal(client, producer, uid: str, expires_in: int | None = None):
    """Sign `client` in to uid's portal through a fresh link; returns the link's path (now used)."""
    path = link_path(producer, uid, expires_in)
    resp = client.get(path)
    assert resp.status_code == 302 and resp.headers["Location"].endswith("/portal/"), resp.get_data(as_text=True)
    return path
