"""The CLI's client for a running server: the one that owns the data dir (its URL is in the data-dir lock),
the one named by `--server` / `BLENDRAG_URL`, or one that announced itself (app/server_registry.py).

`blendrag ingest` uploads the files to `POST /ingest` and follows the job; `blendrag ask` streams
`POST /ask`; `blendrag cache stats` reads `GET /api/stats`. The key sent as a bearer token is the
client's (`--api-key` / `BLENDRAG_API_KEY`), else `server.api_key` of the same settings.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from app.sse_reader import iter_sse, sse_lines

if TYPE_CHECKING:
    from app.server_registry import Announced

TIMEOUT_S = 30.0
POLL_S = 1.0  # job polling when the event stream is unavailable: at most once a second


class RemoteError(RuntimeError):
    """The server answered with an error (message from its `detail`) or could not be reached."""

    def __init__(self, message: str, status: int | None = None, detail: str | None = None) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status; None: no answer
        self.detail = detail  # the answer's `detail` message, when it had one


class RemoteServer:
    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> RemoteServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise RemoteError(f"cannot reach the server at {self.url}: {exc}") from exc
        _raise_for_status(response)
        return response.json()

    def ingest_files(
        self, files: list[Path], tags: list[str], names: list[str] | None = None, collection: str | None = None
    ) -> dict[str, Any]:
        """Upload files in one multipart request; the IngestAccepted body (job_id, document_ids).

        `names` are what the server records as each file's source (its path relative to the folder the
        user named, e.g. `advanced/timeouts.md`); without them, the files' base names."""
        names = names if names is not None else [f.name for f in files]
        with ExitStack() as stack:
            parts = [
                ("files", (name, stack.enter_context(f.open("rb")), "application/octet-stream"))
                for f, name in zip(files, names, strict=True)
            ]
            data = {"tags": ",".join(tags)} if tags else {}
            if collection is not None:
                data["collection"] = collection
            return self._request("POST", "/ingest", files=parts, data=data, timeout=None)

    def job(self, job_id: str) -> dict[str, Any]:
        return self._request("GET", f"/ingest/jobs/{job_id}")

    def wait_job(self, job_id: str, on_progress: Any = None) -> dict[str, Any]:
        """Follow the job's event stream (one request, one access-log line, updates as they happen) until
        it finishes; the final job. If the stream breaks off, polls once a second instead."""
        try:
            with self._client.stream(
                "GET", f"/ingest/jobs/{job_id}/events", timeout=httpx.Timeout(TIMEOUT_S, read=None)
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    _raise_for_status(response)
                for message in iter_sse(sse_lines(response.iter_text())):
                    if message.event in ("progress", "done") and isinstance(message.data, dict):
                        if on_progress is not None:
                            on_progress(message.data)
                        if message.event == "done":
                            return message.data
        except httpx.HTTPError:
            pass  # fall back to polling below
        while True:
            job = self.job(job_id)
            if on_progress is not None:
                on_progress(job)
            if job["status"] in ("succeeded", "failed", "cancelled"):
                return job
            time.sleep(POLL_S)

    def sync_plan(self, body: dict[str, Any]) -> dict[str, Any]:
        """What a sync of a folder must ingest and remove (`blendrag sync`; a refusal is a RemoteError)."""
        return self._request("POST", "/syncs/plan", json=body)

    def sync_remove(self, body: dict[str, Any]) -> dict[str, Any]:
        """Delete the documents of the files a synced folder no longer has."""
        return self._request("POST", "/syncs/remove", json=body, timeout=None)

    def sync_finish(self, body: dict[str, Any]) -> dict[str, Any]:
        """Remove what the folder no longer has and record the sync, once its files were ingested."""
        return self._request("POST", "/syncs/finish", json=body, timeout=None)

    def purge_failed(self) -> int:
        return int(self._request("DELETE", "/documents", params={"status": "failed"})["deleted"])

    def stats(self) -> dict[str, Any]:
        return self._request("GET", "/api/stats")

    def ask(self, body: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        """(event, data) of the /ask stream: sources, token…, done or error."""
        try:
            with self._client.stream(
                "POST", "/ask", json=body, timeout=httpx.Timeout(TIMEOUT_S, read=None)
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    _raise_for_status(response)
                # Lines end at CR/LF only: iter_lines also splits at U+2028, which a quoted passage may hold.
                for message in iter_sse(sse_lines(response.iter_text())):
                    if isinstance(message.data, dict):
                        yield message.event or "message", message.data
        except httpx.HTTPError as exc:
            raise RemoteError(f"cannot reach the server at {self.url}: {exc}") from exc


def find_server(host: str, port: int) -> str | None:
    """The URL of a blendrag server answering on (host, port), or None (nothing there, or not blendrag)."""
    probe_host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return probe(f"http://{probe_host}:{port}")


class SeveralServers(RuntimeError):
    """Several announced servers answer and none is clearly the CLI's: it lists them instead of guessing."""

    def __init__(self, servers: list[Announced], here: Path) -> None:
        self.servers = servers
        lines = [f"  {s.url}  data dir {s.data_dir}  pid {s.pid}" for s in servers]
        mine = sum(s.started_in == str(here.resolve()) for s in servers)
        which = f"{mine} of them started from this folder ({here})" if mine else f"none started from {here}"
        super().__init__(
            f"{len(servers)} blendrag servers are running, {which}; name one with --server URL (or "
            "BLENDRAG_URL), or run the command from the folder its `make serve` ran in:\n" + "\n".join(lines)
        )


def discover(runtime_dir: Path, host: str, port: int, here: Path) -> tuple[str, str] | None:
    """A running server for a CLI command in folder `here` that has none named: (url, how it was found), or
    None. Raises SeveralServers when several answer and none is clearly this folder's.

    Among the servers that announced themselves and answer: the one started from `here` (the checkout whose
    `make serve DATA=…` it is, whatever data dir it serves), else the only one (app/server_registry.py
    `choose`); with none announced, the one on the configured port."""
    from app.server_registry import announced, choose

    answering = [s for s in announced(runtime_dir) if probe(s.url) is not None]
    chosen = choose(answering, here)
    if chosen is not None:
        url = chosen.url.rstrip("/")
        origin = ", started from this folder" if chosen.started_in == str(here.resolve()) else ""
        return url, f"the blendrag server at {url} (data dir {chosen.data_dir}{origin})"
    if answering:
        raise SeveralServers(answering, here)
    url = find_server(host, port)
    return None if url is None else (url, f"the blendrag server at {url}")


def probe(url: str) -> str | None:
    """`url` (without a trailing slash) when a blendrag server answers there, else None."""
    url = url.rstrip("/")
    try:
        response = httpx.get(f"{url}/health", timeout=1.0)
        ready = httpx.get(f"{url}/ready", timeout=1.0)
        if response.status_code == 200 and response.json() == {"status": "ok"} and "status" in ready.json():
            return url
    except (httpx.HTTPError, ValueError, TypeError):
        return None
    return None


def _raise_for_status(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        detail = response.json().get("detail")
    except ValueError:
        detail = None
    raise RemoteError(
        f"server answered {response.status_code}: {detail or response.text[:200]}",
        response.status_code,
        detail if isinstance(detail, str) else None,
    )
