"""The dashboard's web server: a Starlette app served by uvicorn (both imported only here, only
when a dashboard starts: ``hotswap[dashboard]``).

Read-only: every route is a GET. ``/`` is the page (static files shipped in the package, charts
by the vendored uPlot: no CDN, it works offline); ``/api/state`` the current document;
``/api/stream`` server-sent events: the document whenever it changes (looked for every 0.1 s)
and a ping every second, so the page can tell a silent server from a quiet cluster; at most
``MAX_STREAMS`` at once (each polls), so ``/healthz`` answers however many views are opened.

Bound to loopback unless ``expose`` is given; exposed, every request needs the token (a
``?token=`` on the first visit sets a cookie; scripts send ``Authorization: Bearer``). On
loopback, a request whose Host is not a loopback name is refused (DNS rebinding).
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import socket
import threading
from importlib import resources
from typing import Any

from hotswap.api.addresses import is_loopback
from hotswap.api.errors import ConflictError, InvalidInputError
from hotswap.dashboard.source import ClusterSource

STREAM_POLL_S = 0.1
PING_S = 1.0
MAX_STREAMS = 64  # event streams served at once; more are refused (503), so /healthz still answers
COOKIE = "hotswap_dashboard_token"
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


MIN_TOKEN = 16


def check_token(token: str | None, given_as: str = "--token") -> None:
    """A token, wherever it came from, is 16+ visible characters: a blank one (an empty
    HOTSWAP_DASHBOARD_TOKEN, 16 spaces) would protect nothing."""
    if token is None:
        return
    if not token.strip():
        raise InvalidInputError(f"{given_as} is blank: a dashboard token must be {MIN_TOKEN}+ visible characters (unset it to serve loopback without one)")
    if any(c.isspace() or not c.isprintable() for c in token):
        raise InvalidInputError(f"{given_as} contains whitespace or control characters: a dashboard token must be {MIN_TOKEN}+ visible characters")
    if len(token) < MIN_TOKEN:
        raise InvalidInputError(f"{given_as} is {len(token)} characters: a dashboard token must be at least {MIN_TOKEN}")


def check_binding(host: str, expose: bool, token: str | None) -> None:
    """Loopback needs nothing; any other address needs ``--expose`` and a real token."""
    check_token(token)
    if is_loopback(host):
        return
    if not expose:
        raise InvalidInputError(f"--host {host} is not loopback: add --expose (and a token) to serve beyond this machine")
    if not token:
        raise InvalidInputError(
            f"--expose needs a token of at least {MIN_TOKEN} characters (--token-file FILE, or HOTSWAP_DASHBOARD_TOKEN)"
        )


def host_name(header: str) -> str:
    """The name in a Host header, without its port (``[::1]:8787`` -> ``::1``)."""
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


def loopback_host(header: str | None) -> bool:
    """Whether a request's Host names this machine's loopback: a page served on loopback
    answers no other name, so a site that points its own name at 127.0.0.1 (DNS rebinding)
    cannot read it through the visitor's browser."""
    name = host_name(header or "").lower().rstrip(".")
    return name == "localhost" or name.endswith(".localhost") or is_loopback(name)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, or one line saying why not (a port in use, an unknown address)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family = infos[0][0]
        return socket.create_server((host, port), family=family, reuse_port=False)
    except socket.gaierror:
        raise InvalidInputError(f"--host {host}: not an address of this machine") from None
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            raise ConflictError(f"port {port} on {host} is in use: choose another with --port (0: any free port)") from None
        raise InvalidInputError(f"cannot listen on {host}:{port}: {error.strerror}") from None


def create_app(source: ClusterSource, token: str | None = None, loopback: bool = True) -> Any:
    """The app; ``loopback``: served on a loopback address, so it answers loopback Host names only."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.base import BaseHTTPMiddleware
    from starlette.requests import Request
    from starlette.responses import (
        FileResponse,
        JSONResponse,
        PlainTextResponse,
        Response,
        StreamingResponse,
    )
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    static = resources.files("hotswap.dashboard") / "static"

    def authorised(request: Request) -> bool:
        if token is None:
            return True
        given = request.query_params.get("token") or request.cookies.get(COOKIE) or ""
        header = request.headers.get("authorization", "")
        if header.lower().startswith("bearer "):
            given = header[7:].strip()
        return hmac.compare_digest(given.encode(), token.encode())

    async def guard(request: Request, call_next: Any) -> Response:
        if loopback and not loopback_host(request.headers.get("host")):
            return PlainTextResponse("hotswap dashboard: served on loopback; this Host is not a loopback name\n", 403)
        if not authorised(request):
            return PlainTextResponse("hotswap dashboard: a token is required (open the URL printed at start)\n", 401)
        response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        if token is not None and request.query_params.get("token"):
            response.set_cookie(COOKIE, token, httponly=True, samesite="strict")
        return response

    async def index(request: Request) -> Response:
        return FileResponse(str(static / "index.html"), media_type="text/html")

    async def state(request: Request) -> Response:
        _, text = source.snapshot()
        return Response(text, media_type="application/json")

    streams: set[object] = set()  # the event streams open now (one event loop: no lock)

    async def stream(request: Request) -> Response:
        if len(streams) >= MAX_STREAMS:  # each polls: unbounded, they would starve /healthz
            return PlainTextResponse(
                f"hotswap dashboard: {MAX_STREAMS} live views are open already; close one or use /api/state\n",
                503, headers={"Retry-After": "5"},
            )
        mine = object()
        streams.add(mine)  # (taken here: a stream refused or ended gives its place back below)

        async def events() -> Any:
            sent = -1
            quiet = 0.0
            try:
                while not source.stopped and not await request.is_disconnected():
                    version, text = source.snapshot()
                    if version != sent:
                        sent, quiet = version, 0.0
                        yield f"event: state\ndata: {text}\n\n"
                    elif quiet >= PING_S:
                        quiet = 0.0
                        yield f"event: ping\ndata: {text}\n\n"
                    await asyncio.sleep(STREAM_POLL_S)
                    quiet += STREAM_POLL_S
            finally:
                streams.discard(mine)

        return StreamingResponse(events(), media_type="text/event-stream", headers={"X-Accel-Buffering": "no"})

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True, "looks": source.looks, "error": source.error})

    routes = [
        Route("/", index),
        Route("/api/state", state),
        Route("/api/stream", stream),
        Route("/healthz", health),
        Mount("/static", StaticFiles(directory=str(static)), name="static"),
    ]
    return Starlette(routes=routes, middleware=[Middleware(BaseHTTPMiddleware, dispatch=guard)])


class Dashboard:
    """A dashboard of one cluster: the source's thread and the web server (in the calling
    thread with :meth:`serve_forever`, or in a thread of its own with :meth:`start`)."""

    def __init__(self, source: ClusterSource, host: str = "127.0.0.1", port: int = 8787, token: str | None = None) -> None:
        import uvicorn

        self.source = source
        self.socket = bind(host, port)
        bound = self.socket.getsockname()
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        self.url = f"http://{shown}:{bound[1]}/" + (f"?token={token}" if token else "")
        config = uvicorn.Config(
            create_app(source, token, loopback=is_loopback(host)), log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=2
        )
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def serve_forever(self) -> None:
        self.source.start()
        try:
            self.server.run(sockets=[self.socket])
        finally:
            self.source.stop()
            self.socket.close()

    def start(self) -> None:
        self.source.start()
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.source.stop()  # first: it ends the event streams, which a graceful shutdown waits for
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.socket.close()
