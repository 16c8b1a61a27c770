"""The chat page: plain files, no build step; / serves the page (or, to clients that are no
browser, what is served where), /ui/ its files."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ragchains import __version__

WEB = Path(str(resources.files("ragchains") / "web"))
# The page loads and calls nothing but this server: no CDN, no inline script, no framing.
# PDF.js compiles its image and colour decoders to WebAssembly ('wasm-unsafe-eval' allows
# that, not eval), runs in a worker from /ui/vendor/, and scans are shown from blob: URLs.
PAGE_HEADERS = {
    "Cache-Control": "no-cache",
    "Content-Security-Policy": "default-src 'self'; script-src 'self' 'wasm-unsafe-eval'; "
    "worker-src 'self'; img-src 'self' data: blob:; connect-src 'self'; object-src 'none'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
}


class NoCache:
    """ASGI: the wrapped app's replies revalidated on each load (``Cache-Control:
    no-cache``), so that an upgrade of the page's files is seen at once."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def revalidated(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)["Cache-Control"] = "no-cache"
            await send(message)

        await self.app(scope, receive, revalidated)


def add_page(app: FastAPI, routes: dict[str, str]) -> None:
    """The page at / and its files at /ui/; ``routes``: each chain's path and summary."""

    @app.get("/", include_in_schema=False)
    async def index(request: Request) -> Response:
        """The chat page for browsers; for other clients, what is served where."""
        if "text/html" in request.headers.get("accept", ""):
            return FileResponse(WEB / "index.html", headers=PAGE_HEADERS)
        return JSONResponse(
            {
                "name": "ragchains",
                "version": __version__,
                "page": "/",
                "playground": "/chat/playground/",
                "docs": "/docs",
                "routes": {f"/{route}": summary for route, summary in routes.items()},
            }
        )

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        """No icon, and no 404 either: a browser asks for one with every document it opens
        from here (an original file, the API docs), which would show as a console error."""
        return Response(status_code=204, headers={"Cache-Control": "max-age=86400"})

    app.mount("/ui", NoCache(StaticFiles(directory=WEB)), name="ui")
