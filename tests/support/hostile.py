"""A hostile HTTP receiver on 127.0.0.1, written on raw asyncio streams so it can break HTTP in
ways a real server library will not: each path answers with exact bytes, or a behaviour.

  /retry-after/<name>   429 with one of RETRY_AFTER's odd values (raw bytes, UTF-8 where not ASCII)
  /bad-status           a status line that is not HTTP
  /bad-status-code      "HTTP/1.1 2OO OK"
  /bad-header           a header line without a colon
  /bad-chunking         chunked, with a chunk size that is not hex (in the same packet as the head)
  /cut-after-head       200 announcing 1000 bytes, then closing a moment later without one
  /cut-mid-body         200 announcing 1000 bytes, sending 10, then closing
  /huge                 200 with a 50 MB body, written as fast as the client takes it
  /trickle              the answer at 1 byte per second
  /gzip                 200 with a gzip-compressed body (whatever Accept-Encoding said)
  /close-at-once        closes without a byte
"""

from __future__ import annotations

import asyncio
import gzip
import threading
from collections import Counter

RETRY_AFTER = {
    "superscript": "\u00b2".encode(),       # str.isdigit() is true, float() raises
    "circled": "\u2460".encode(),           # the same
    "arabic-indic": "\u0661\u0662".encode(),  # isdigit() and float() both take it: 12 s, or not ASCII: ignored
    "negative": b"-5",
    "exponent": b"1e3",
    "huge": b"9" * 400,
    "far-date": b"Fri, 31 Dec 9999 23:59:59 GMT",
    "bad-date": b"Mon, 99 Foo 2026 25:61:61 GMT",
    "empty": b"",
    "latin1": b"\xb2\xb3",
}

HUGE_BYTES = 50 * 1024 * 1024
BODY = b"hostile says no"


def _answer(status_line: bytes, headers: list[bytes], body: bytes = BODY) -> bytes:
    head = [status_line, *headers, b"Content-Length: %d" % len(body), b"Connection: close"]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


FIXED = {
    "/bad-status": b"SPEAKING GIBBERISH\r\n\r\n",
    "/bad-status-code": _answer(b"HTTP/1.1 2OO OK", []),
    "/bad-header": b"HTTP/1.1 200 OK\r\nThis line has no colon\r\nContent-Length: 2\r\n\r\nok",
    "/bad-chunking": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
    "/cut-mid-body": b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789",
    "/gzip": _answer(b"HTTP/1.1 200 OK", [b"Content-Encoding: gzip"], gzip.compress(b"compressed but readable" * 100)),
    "/close-at-once": b"",
}


class HostileReceiver:
    def __init__(self):
        self.hits: Counter = Counter()
        self.huge_bytes_sent = 0  # how much of the 50 MB body the client let us write
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.url = ""

    def _run(self):
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1].decode()
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            with self._lock:
                self.hits[path] += 1
            await self._answer(path, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client gave up: that is what some of these answers are for
        finally:
            writer.close()

    async def _answer(self, path: str, writer: asyncio.StreamWriter):
        if path.startswith("/retry-after/"):
            value = RETRY_AFTER[path.rsplit("/", 1)[1]]
            writer.write(_answer(b"HTTP/1.1 429 Too Many Requests", [b"Retry-After: " + value]))
        elif path == "/huge":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % HUGE_BYTES)
            chunk = b"x" * 65536
            for _ in range(HUGE_BYTES // len(chunk)):
                writer.write(chunk)
                await writer.drain()  # blocks while the client does not read
                self.huge_bytes_sent += len(chunk)
        elif path == "/cut-after-head":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.2)
        elif path == "/trickle":
            for byte in _answer(b"HTTP/1.1 200 OK", []):
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(1)
        else:
            writer.write(FIXED[path])
        await writer.drain()

    def __enter__(self):
        self._thread.start()
        self._ready.wait(5)
        return self

    def __exit__(self, *exc):
        async def stop():
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
