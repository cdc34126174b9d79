"""A Hugging Face hub stand-in for tests: a local HTTP server the real `huggingface_hub` client talks to.

It speaks the part of the hub API that `snapshot_download` and `HfApi.model_info` use
(checked against huggingface_hub 2.x): `GET /api/models/{repo}/revision/{rev}` (repo info
with `sha` and `siblings`), `GET /api/models/{repo}/tree/{rev}` (the file list, with sizes
and git blob ids), and `HEAD`/`GET /{repo}/resolve/{rev}/{file}` with `X-Repo-Commit`,
`ETag`, `Content-Length` and `Range`. Errors carry the hub's `X-Error-Code` /
`X-Error-Message` headers and a JSON `{"error": ...}` body, so the client raises the same
exception types it raises against the real hub (RepoNotFound, RevisionNotFound,
EntryNotFound; 401 for a private repo without the right token).

Bytes can be throttled (`bytes_per_second`, read at every 16 KiB piece, so a test may lift
it mid-way) so that a download lasts long enough to watch its progress or kill it mid-way
without big files. Every request is recorded in
`requests` (method, path, Range header) so tests can see what the client asked for.

Not guaranteed: Xet storage, LFS pointers, pagination of big trees, or any write API.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


@dataclass
class HubRepo:
    """One model repo: its branches (name -> commit sha) and each commit's files."""

    repo_id: str
    commits: dict[str, dict[str, bytes]]
    refs: dict[str, str]
    token: str | None = None  # a private repo answers only this bearer token

    def commit_of(self, revision: str) -> str | None:
        if revision in self.commits:
            return revision
        return self.refs.get(revision)


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def make_repo(
    repo_id: str, files: Mapping[str, bytes], *, seed: str = "", token: str | None = None
) -> HubRepo:
    """A repo whose `main` points at one commit holding `files`."""
    digest = hashlib.sha1((repo_id + seed).encode())
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name])
    sha = digest.hexdigest()
    return HubRepo(repo_id=repo_id, commits={sha: dict(files)}, refs={"main": sha}, token=token)


@dataclass
class HubStandin:
    """State shared with the handler threads; `url` is what HF_ENDPOINT is set to."""

    repos: dict[str, HubRepo] = field(default_factory=dict)
    bytes_per_second: int = 0  # 0: as fast as the socket takes them
    requests: list[tuple[str, str, str]] = field(default_factory=list)
    url: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, repo: HubRepo) -> HubRepo:
        with self.lock:
            self.repos[repo.repo_id] = repo
        return repo

    def file_gets(self, name: str) -> list[tuple[str, str, str]]:
        """The GETs of file `name` so far (method, path, Range header)."""
        with self.lock:
            return [r for r in self.requests if r[0] == "GET" and r[1].endswith("/" + name)]


_REVISION = re.compile(r"^/api/models/([^/]+/[^/]+)/revision/([^/]+)$")
_TREE = re.compile(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?$")
_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
_CHUNK = 16 * 1024


class _Handler(BaseHTTPRequestHandler):
    hub: HubStandin
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        return  # keep pytest output clean

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _serve(self, *, head: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        with self.hub.lock:
            self.hub.requests.append((self.command, path, self.headers.get("Range", "")))
        if match := _REVISION.match(path):
            self._repo_info(match[1], match[2])
        elif match := _TREE.match(path):
            self._tree(match[1], match[2], match[3] or "")
        elif match := _RESOLVE.match(path):
            self._resolve(match[1], match[2], match[3], head=head)
        else:
            self._error(404, "", "Not Found")

    def _lookup(self, repo_id: str, revision: str) -> tuple[HubRepo, str] | None:
        with self.hub.lock:
            repo = self.hub.repos.get(repo_id)
        if repo is None or (
            repo.token is not None
            and self.headers.get("Authorization", "") != f"Bearer {repo.token}"
        ):
            # The hub answers a private repo without the right token like a missing one.
            status = 401 if repo is not None or not self.headers.get("Authorization") else 404
            self._error(status, "RepoNotFound", "Repository not found")
            return None
        sha = repo.commit_of(revision)
        if sha is None:
            self._error(404, "RevisionNotFound", "Invalid rev id: " + revision)
            return None
        return repo, sha

    def _repo_info(self, repo_id: str, revision: str) -> None:
        found = self._lookup(repo_id, revision)
        if found is None:
            return
        repo, sha = found
        files = repo.commits[sha]
        self._json(
            {
                "_id": hashlib.md5(repo_id.encode()).hexdigest()[:24],
                "id": repo_id,
                "modelId": repo_id,
                "sha": sha,
                "private": repo.token is not None,
                "disabled": False,
                "gated": False,
                "tags": [],
                "downloads": 0,
                "likes": 0,
                "siblings": [
                    {"rfilename": name, "size": len(data)} for name, data in files.items()
                ],
                "lastModified": "2026-01-01T00:00:00.000Z",
                "createdAt": "2026-01-01T00:00:00.000Z",
                "usedStorage": sum(len(d) for d in files.values()),
            }
        )

    def _tree(self, repo_id: str, revision: str, prefix: str) -> None:
        found = self._lookup(repo_id, revision)
        if found is None:
            return
        repo, sha = found
        entries = [
            {"type": "file", "oid": _git_blob_id(data), "size": len(data), "path": name}
            for name, data in sorted(repo.commits[sha].items())
            if not prefix or name.startswith(prefix.rstrip("/") + "/")
        ]
        self._json(entries)

    def _resolve(self, repo_id: str, revision: str, name: str, *, head: bool) -> None:
        found = self._lookup(repo_id, revision)
        if found is None:
            return
        repo, sha = found
        data = repo.commits[sha].get(name)
        if data is None:
            self._error(404, "EntryNotFound", f"{name} does not exist on {revision!r}")
            return
        start, end = 0, len(data)
        status = 200
        wanted = self.headers.get("Range", "")
        if wanted and (match := _RANGE.match(wanted)):
            start = int(match[1])
            end = min(len(data), int(match[2]) + 1) if match[2] else len(data)
            if start >= len(data) and len(data) > 0:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        self.send_response(status)
        self.send_header("X-Repo-Commit", sha)
        self.send_header("ETag", f'"{_git_blob_id(data)}"')
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.end_headers()
        if head:
            return
        self._send_throttled(data[start:end])

    def _send_throttled(self, body: bytes) -> None:
        try:
            for offset in range(0, len(body), _CHUNK):
                piece = body[offset : offset + _CHUNK]
                self.wfile.write(piece)
                self.wfile.flush()
                # Read at every piece: a test may lift the pacing once it has seen enough.
                rate = self.hub.bytes_per_second
                if rate:
                    time.sleep(len(piece) / rate)  # the stand-in's own pacing, not a test wait
        except (BrokenPipeError, ConnectionResetError):
            return  # the client went away (a killed download)

    def _json(self, payload: object) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


@contextmanager
def serve_hub(hub: HubStandin | None = None) -> Iterator[HubStandin]:
    """Run a hub stand-in on a free loopback port for the duration of the block."""
    hub = hub or HubStandin()
    handler = type("HubHandler", (_Handler,), {"hub": hub})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="hub-standin", daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
