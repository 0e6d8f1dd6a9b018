"""A local webhook receiver on 127.0.0.1: every request it got (method, path, JSON body, arrival
time), answered with a status its owner sets. The soak benchmark counts the alert sensor's posts
with it; the tests use it to see what the alert sensor sends."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Receiver:
    """A local webhook: every request it got, and the status it answers with."""

    url: str
    requests: list[dict] = field(default_factory=list)
    status: int = 200

    @property
    def texts(self) -> list[str]:
        return [request["body"]["text"] for request in self.requests]

    def posted(self, text: str) -> list[float]:
        """When each post whose text holds `text` arrived (time.time())."""
        return [r["at"] for r in self.requests if r["body"] and text in r["body"]["text"]]

    def posts_between(self, start: float, end: float) -> int:
        return sum(
            1 for r in list(self.requests) if r["method"] == "POST" and start <= r["at"] < end
        )


@contextlib.contextmanager
def receiving(path: str = "/alerts") -> Iterator[Receiver]:
    """A receiver listening on a free port of 127.0.0.1 at `path` until the block ends."""
    receiver = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"] or 0))
            self._record(json.loads(body) if body else None)

        def do_GET(self):
            self._record(None)

        def _record(self, body):
            receiver.requests.append(
                {
                    "method": self.command,
                    "path": self.path,
                    "content_type": self.headers["Content-Type"],
                    "body": body,
                    "at": time.time(),
                }
            )
            self.send_response(receiver.status)
            if 300 <= receiver.status < 400:
                self.send_header("Location", "/elsewhere")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}{path}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


__all__ = ["Receiver", "receiving"]
