"""`trainctl ui`: a local, read-only web dashboard over a store (Starlette, served by uvicorn).

Pages (HTML shells that the bundled scripts fill from the JSON API; nothing is fetched from
elsewhere): the job list, and a job page with its attempts, metric charts, each node's live
log and its artifacts.

    GET /                                       job list
    GET /jobs/{job}                             job page
    GET /api/jobs                               [describe()] newest first
    GET /api/jobs/{job}                         describe() (the same redaction)
    GET /api/jobs/{job}/metrics                 the metric history
    GET /api/jobs/{job}/logs?attempt=&rank=&offset=   a log from a byte offset
    GET /api/jobs/{job}/artifacts               the job's files
    GET /api/jobs/{job}/files/{path}            one file, downloaded
    GET /tuning                                 tuning job list
    GET /tuning/{name}                          tuning job page: trials, the best, curves
    GET /api/tuning                             [tuning_summary] newest first
    GET /api/tuning/{name}                      tuning_view (trials and their curves)
    POST /api/jobs/{job}/tensorboard            TensorBoard over the job's logs: {"url"}

Read-only: nothing writes to the store. The one POST starts TensorBoard (trainctl.tensorboard)
on this machine's loopback, one per job, ended with the dashboard; it needs the header
`X-Trainctl: 1`, which another site's page cannot send without a CORS preflight that is never
answered. A token, when set, is required on every request (`?token=` once, then a cookie).
"""

from __future__ import annotations

import contextlib
import hmac
import html
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from trainctl.controller.supervise import controller_view
from trainctl.errors import NotFoundError, SpecError, TrainctlError, UnreadableRecordError
from trainctl.record.jobstore import JobStore
from trainctl.record.keys import JobKeys
from trainctl.record.search import scan_jobs
from trainctl.store import Store
from trainctl.tensorboard import TensorBoard

STATIC = ("app.js", "chart.js", "style.css")
MAX_LOG_CHUNK = 256 * 1024
TOKEN_COOKIE = "trainctl_token"


def make_app(store: Store, *, token: str | None = None, hosts: list[str] | None = None) -> Any:
    """The dashboard over `store`: every request needs `token` when one is set, and a Host
    header among `hosts` when those are given (a token-less loopback server; see
    trainctl.ui.allowed_hosts)."""
    dashboard = Dashboard(store)
    guard = Middleware(_Guard, token=token, hosts=hosts)
    return Starlette(routes=dashboard.routes(), middleware=[guard], lifespan=dashboard.lifespan)


class Dashboard:
    """The pages and the JSON API over one store, a handler a route."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.boards: dict[str, TensorBoard] = {}  # job -> the TensorBoard started for it

    def routes(self) -> list[Route]:
        return [
            Route("/", self.index),
            Route("/jobs/{job}", self.job_page),
            Route("/api/jobs", self.api_jobs),
            Route("/api/jobs/{job}", self.api_job),
            Route("/api/jobs/{job}/metrics", self.api_metrics),
            Route("/api/jobs/{job}/logs", self.api_logs),
            Route("/api/jobs/{job}/artifacts", self.api_artifacts),
            Route("/api/jobs/{job}/files/{path:path}", self.api_file),
            Route("/api/jobs/{job}/tensorboard", self.api_tensorboard, methods=["POST"]),
            Route("/tuning", self.tunings_page),
            Route("/tuning/{name}", self.tuning_page),
            Route("/api/tuning", self.api_tunings),
            Route("/api/tuning/{name}", self.api_tuning),
            Route("/static/{name}", self.static),
        ]

    def job_store(self, request: Request) -> JobStore:
        name = request.path_params["job"]
        jobs = JobStore(self.store, name)
        if not jobs.exists():
            jobs.load()  # UnreadableRecordError (409) where the job's files have no record
            raise NotFoundError(f"no job {name!r} in {self.store.uri}")
        return jobs

    def describe(self, jobs: JobStore) -> dict[str, Any]:
        record = jobs.load()
        return {**record.describe(), "controller": controller_view(jobs, record)}

    async def index(self, request: Request) -> Response:
        return HTMLResponse(_page("trainctl jobs", "jobs", self.store.uri))

    async def job_page(self, request: Request) -> Response:
        jobs = self.job_store(request)
        return HTMLResponse(_page(f"trainctl {jobs.name}", "job", self.store.uri, job=jobs.name))

    async def api_jobs(self, request: Request) -> Response:
        # diagnose's measurement runs only with ?all=1 (as `trainctl jobs --all`)
        every = request.query_params.get("all") == "1"
        records, unreadable = scan_jobs(self.store, measurements=every)
        return JSONResponse([r.describe() for r in records] + [u.describe() for u in unreadable])

    async def api_job(self, request: Request) -> Response:
        return JSONResponse(self.describe(self.job_store(request)))

    async def api_metrics(self, request: Request) -> Response:
        return JSONResponse(self.job_store(request).metric_history())

    async def api_logs(self, request: Request) -> Response:
        jobs = self.job_store(request)
        try:
            attempt = int(request.query_params.get("attempt", "1"))
            rank = int(request.query_params.get("rank", "0"))
            offset = max(0, int(request.query_params.get("offset", "0")))
            if not (0 <= attempt < 2**31 and 0 <= rank < 2**31 and offset < 2**62):
                raise ValueError("out of range")
        except ValueError:
            return PlainTextResponse(
                "attempt, rank and offset are numbers (attempt and rank below 2^31, offset "
                "below 2^62)",
                status_code=400,
            )
        try:
            chunk = self.store.get_range(JobKeys(jobs.name).log(attempt, rank), offset)
        except NotFoundError:
            chunk = b""
        whole = len(chunk) <= MAX_LOG_CHUNK and jobs.load().state.is_terminal()
        chunk = chunk[:MAX_LOG_CHUNK]
        if not whole:  # whole lines only: the rest comes with the next poll
            chunk = chunk[: chunk.rindex(b"\n") + 1] if b"\n" in chunk else b""
        from trainctl.protocol import CONTROL_PREFIX, split_stamp

        texts = [
            split_stamp(line)[1] for line in chunk.decode("utf-8", errors="replace").splitlines()
        ]
        lines = [text for text in texts if CONTROL_PREFIX not in text]
        return JSONResponse({"offset": offset + len(chunk), "lines": lines})

    async def api_artifacts(self, request: Request) -> Response:
        from trainctl.controller.artifacts import job_artifacts

        jobs = self.job_store(request)
        prefix = self.store.child(JobKeys(jobs.name).prefix).uri
        files = []
        for root, infos in job_artifacts(self.store, jobs.name):  # (only what may be shown)
            for info in infos:
                path = info.key if root == prefix else f"output/{info.key}"
                files.append({"path": path, "size": info.size, "mtime": info.mtime})
        return JSONResponse(sorted(files, key=lambda f: f["path"]))

    async def api_file(self, request: Request) -> Response:
        from trainctl.controller.artifacts import (
            RECORD_FILE,
            job_file_key,
            redacted_record,
            shown,
        )
        from trainctl.record.locations import output_store

        jobs = self.job_store(request)
        # Decoded once (by the router), then one spelling and one allow-list, shared with
        # `trainctl artifacts`: `%2e/job.json`, `job.json%2f.` and `JOB.JSON` reach no
        # more than `job.json` does.
        try:
            path = job_file_key(request.path_params["path"])
        except SpecError:
            return PlainTextResponse("not a file of the job", status_code=400)
        if path == RECORD_FILE:  # the record holds the job's secrets: shown redacted only
            return Response(
                redacted_record(self.store, jobs.name),
                media_type="application/json",
                headers={"Content-Disposition": 'attachment; filename="job.json"'},
            )
        candidates = [(self.store.child(JobKeys(jobs.name).prefix), path)] if shown(path) else []
        if path.startswith("output/"):
            candidates.append((output_store(jobs.load()), path[len("output/") :]))
        for root, key in candidates:
            try:
                data = root.get_bytes(key)
            except NotFoundError:
                continue
            leaf = path.rsplit("/", 1)[-1].replace('"', "")
            return Response(
                data,
                media_type="application/octet-stream",
                headers={"Content-Disposition": f'attachment; filename="{leaf}"'},
            )
        return PlainTextResponse(f"{path} not found", status_code=404)

    def tuning_store(self, request: Request) -> Any:
        from trainctl.tuning.record import TuningStore

        tuning = TuningStore(self.store, request.path_params["name"])
        if not tuning.exists():
            raise NotFoundError(f"no tuning job {tuning.name!r} in {self.store.uri}")
        return tuning

    async def tunings_page(self, request: Request) -> Response:
        return HTMLResponse(_page("trainctl tuning jobs", "tunings", self.store.uri))

    async def tuning_page(self, request: Request) -> Response:
        tuning = self.tuning_store(request)
        return HTMLResponse(
            _page(f"trainctl tuning {tuning.name}", "tuning", self.store.uri, job=tuning.name)
        )

    async def api_tunings(self, request: Request) -> Response:
        from trainctl.tuning import tuning_jobs, tuning_summary

        unreadable: list[tuple[str, str]] = []
        records = tuning_jobs(self.store, unreadable)
        return JSONResponse(
            [tuning_summary(r) for r in records]
            + [{"name": n, "state": "Unreadable", "problem": why} for n, why in unreadable]
        )

    async def api_tuning(self, request: Request) -> Response:
        from trainctl.tuning import tuning_view

        return JSONResponse(tuning_view(self.tuning_store(request).load(), self.store))

    async def api_tensorboard(self, request: Request) -> Response:
        from starlette.concurrency import run_in_threadpool

        if request.headers.get("x-trainctl") != "1":
            return PlainTextResponse("the X-Trainctl: 1 header is required", status_code=403)
        name = self.job_store(request).name
        board = self.boards.get(name)
        if board is None or not board.running:
            board = TensorBoard([name], store=self.store, port=0)
            await run_in_threadpool(board.start)
            self.boards[name] = board
        return JSONResponse({"url": board.url})

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Any) -> Any:
        try:
            yield
        finally:
            for board in self.boards.values():
                board.stop()

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return PlainTextResponse("not found", status_code=404)
        text = resources.files("trainctl.ui").joinpath("static", name).read_text()
        kind = {"js": "text/javascript", "css": "text/css"}[name.rsplit(".", 1)[1]]
        return Response(text, media_type=kind)


class _Guard(BaseHTTPMiddleware):
    """Token check (when set) and the Host header (when `hosts`); errors as one line, never
    a traceback."""

    def __init__(self, app: Any, *, token: str | None, hosts: list[str] | None) -> None:
        super().__init__(app)
        self.token = token
        self.hosts = hosts

    async def dispatch(self, request: Request, call_next: Any) -> Response:
        if self.hosts is not None:
            name = request.headers.get("host", "")
            name = name.rsplit(":", 1)[0] if not name.endswith("]") else name
            if name not in self.hosts:
                return PlainTextResponse(
                    "this dashboard answers to its own address only", status_code=421
                )
        if self.token is not None:
            given = request.query_params.get("token") or request.cookies.get(TOKEN_COOKIE)
            if not given or not hmac.compare_digest(given, self.token):
                return PlainTextResponse("a token is required", status_code=401)
        try:
            response = await call_next(request)
        except NotFoundError as exc:
            return PlainTextResponse(str(exc), status_code=404)
        except SpecError as exc:  # a path-like job name in the URL
            return PlainTextResponse(str(exc), status_code=400)
        except UnreadableRecordError as exc:  # one line, as `trainctl status` says it
            return PlainTextResponse(str(exc), status_code=409)
        except TrainctlError as exc:
            return PlainTextResponse(str(exc), status_code=502)
        if self.token is not None and request.query_params.get("token"):
            response.set_cookie(TOKEN_COOKIE, self.token, httponly=True, samesite="strict")
        response.headers["Cache-Control"] = "no-store"
        return response


def _page(title: str, view: str, store_uri: str, *, job: str = "") -> str:
    esc = html.escape
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>
<link rel="stylesheet" href="/static/style.css">
<script src="/static/chart.js"></script><script src="/static/app.js"></script></head>
<body data-view="{esc(view)}" data-job="{esc(job)}">
<header><a href="/">trainctl</a> <a href="/tuning">tuning</a>
<span class="store">{esc(store_uri)}</span></header>
<main id="main"><p class="muted">loading...</p></main>
</body></html>"""
