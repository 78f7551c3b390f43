"""A stand-in for the Hugging Face Hub on loopback, for huggingface_hub's real download code
(HF_ENDPOINT pointed at it): the repo tree, file metadata (HEAD) and downloads (GET, with
Range), gated repos that want a token, and the errors the Hub answers with (`X-Error-Code`).
It counts the downloads of each file, and can serve them slowly, a chunk at a time; a repo has
one commit (`main`, or its hash), and can serve files altered from what their etags say."""

from __future__ import annotations

import collections
import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

TOKEN = "hf_stand_in_token"


@dataclass
class Repo:
    files: dict[str, bytes]
    gated: bool = False
    altered: dict[str, bytes] = field(default_factory=dict)  # served instead, under the files' etags

    def commit(self, repo_id: str) -> str:
        return hashlib.sha1(repo_id.encode()).hexdigest()


@dataclass
class FakeHub:
    repos: dict[str, Repo]
    chunk_delay_s: float = 0.0  # a pause after each MiB sent: a download that takes a while
    downloads: collections.Counter = field(default_factory=collections.Counter)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeHub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                hub._answer(self, body=False)

            def do_GET(self) -> None:
                hub._answer(self, body=True)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _answer(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlsplit(h.path).path)
        tree = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(/.*)?", path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        repo_id = (tree or resolve)[1] if (tree or resolve) else ""
        repo = self.repos.get(repo_id)
        if repo is None:
            return _error(h, 404, "RepoNotFound", "Repository not found")
        if repo.gated and h.headers.get("Authorization") != f"Bearer {TOKEN}":
            return _error(h, 401, "GatedRepo", "Access to this model is restricted")
        if unquote((tree or resolve)[2]) not in ("main", repo.commit(repo_id)):  # one commit, on main
            return _error(h, 404, "RevisionNotFound", "Invalid rev id")
        if tree:
            listing = [
                {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                for name, data in sorted(repo.files.items())
            ]
            return _send(h, 200, {"Content-Type": "application/json"}, json.dumps(listing).encode(), body)
        name = resolve[3]
        if name not in repo.files:
            return _error(h, 404, "EntryNotFound", "Entry not found")
        data = repo.files[name]
        headers = {
            "X-Repo-Commit": repo.commit(repo_id),
            "ETag": f'"{hashlib.sha256(data).hexdigest()}"',  # a Git LFS file's: its sha256
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        start = 0
        if m := re.fullmatch(r"bytes=(\d+)-", h.headers.get("Range", "")):
            start = int(m[1])
        data = repo.altered.get(name, data)
        if body:
            self.downloads[(repo_id, name)] += 1
        status = 206 if start else 200
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        _send(h, status, headers, data[start:], body, self.chunk_delay_s)


def _error(h: BaseHTTPRequestHandler, status: int, code: str, message: str) -> None:
    headers = {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"}
    _send(h, status, headers, json.dumps({"error": message}).encode(), h.command == "GET")


def _send(
    h: BaseHTTPRequestHandler, status: int, headers: dict, data: bytes, body: bool, delay_s: float = 0.0
) -> None:
    h.send_response(status)
    for k, v in headers.items():
        h.send_header(k, v)
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    if not body:
        return
    step = 1 << 20
    for i in range(0, len(data), step):
        h.wfile.write(data[i : i + step])
        if delay_s:
            time.sleep(delay_s)
