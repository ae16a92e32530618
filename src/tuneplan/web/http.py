"""The page's HTTP layer: security headers on every response and a cap on every request body.

A pure ASGI middleware (not Starlette's ``BaseHTTPMiddleware``, which would buffer Gradio's event
streams), given to the FastAPI app Gradio builds (``launch(app_kwargs={"middleware": ...})``).

**Headers.** ``X-Frame-Options: DENY`` and CSP ``frame-ancestors 'none'``: no other site can frame the
page and trick a click. ``X-Content-Type-Options: nosniff``: a downloaded recipe or an uploaded file is
never run as a script or page by a browser guessing its type. ``Referrer-Policy: no-referrer``. The
Content-Security-Policy keeps everything to the page's own origin (scripts, styles, fonts, images,
fetches and event streams, workers), forbids plugins (``object-src 'none'``), a planted ``<base>`` and
forms posting elsewhere. Gradio's page needs inline scripts and styles (its index.html carries the app
config in an inline ``<script>``, Svelte sets inline styles) and string evaluation (Gradio 6's ``gr.HTML``
builds its templates and ``js_on_load`` with ``new Function``: the page's verdict box and chart are
such components), so ``'unsafe-inline'`` and ``'unsafe-eval'`` stay for scripts: the policy does not
stop a script the page itself was made to include; what it stops is loading or sending anything to
another origin, framing, plugins and form posts elsewhere. ``tests/test_web_e2e.py`` loads the page and
fails on any CSP report. ``data:`` and ``blob:`` images are Gradio's own (icons, downloads).

**Body cap.** :data:`BODY_MAX_BYTES` per request, checked on ``Content-Length`` before the app runs and
counted on the bytes as they arrive (a chunked body declares no length): a larger request gets 413 and
is not read further. The largest thing the page takes is a config of ``PASTE_MAX_BYTES`` (512 KiB),
pasted (JSON-encoded in the call: a quote or a backslash doubles, so 1 MiB) or uploaded (multipart
framing adds under a KiB); 2 MiB is twice the largest legitimate request. Without the cap Gradio reads a
50 MiB call whole into memory before any of the page's own limits apply.
"""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException

from tuneplan.web.limits import PASTE_MAX_BYTES

BODY_MAX_BYTES = 4 * PASTE_MAX_BYTES  # 2 MiB: see the module docstring

CONTENT_SECURITY_POLICY = "; ".join((
    "default-src 'self'",
    "script-src 'self' 'unsafe-inline' 'unsafe-eval'",  # Gradio 6's gr.HTML templates: new Function
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data: blob:",
    "font-src 'self' data:",
    "media-src 'self' data: blob:",
    "connect-src 'self'",
    "worker-src 'self' blob:",
    "frame-src 'self'",
    "object-src 'none'",
    "base-uri 'self'",
    "form-action 'self'",
    "frame-ancestors 'none'",
))
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)


class BodyTooLarge(HTTPException):
    """A request body past the cap, found while it arrives: an HTTPException, so that FastAPI's body
    reader passes it on as the 413 it is (any other error there becomes a 400)."""

    def __init__(self, body_max: int) -> None:
        super().__init__(413, _too_large_text(body_max))


class GuardedPage:
    """ASGI middleware: :data:`SECURITY_HEADERS` on every HTTP response (replacing the app's own of the
    same names), and 413 for a request body over ``body_max`` bytes."""

    def __init__(self, app: Any, body_max: int = BODY_MAX_BYTES) -> None:
        self.app = app
        self.body_max = body_max

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # websockets and lifespan pass through untouched
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.body_max:
            await _too_large(send, self.body_max)
            return
        started = False
        received = 0

        async def counted_receive() -> Any:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.body_max:
                    raise BodyTooLarge(self.body_max)
            return message

        async def with_headers(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                names = {name for name, _ in SECURITY_HEADERS}
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                message = {**message, "headers": kept + list(SECURITY_HEADERS)}
            await send(message)

        try:
            await self.app(scope, counted_receive, with_headers)
        except BodyTooLarge:
            if not started:
                await _too_large(send, self.body_max)


def _content_length(scope: dict[str, Any]) -> int | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _too_large_text(body_max: int) -> str:
    return f"request body larger than {body_max // 1024} KiB"


async def _too_large(send: Any, body_max: int) -> None:
    body = (_too_large_text(body_max) + "\n").encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()), *SECURITY_HEADERS]})
    await send({"type": "http.response.body", "body": body})


def middleware() -> list[Any]:
    """The FastAPI ``middleware`` argument that puts :class:`GuardedPage` around Gradio's app."""
    from starlette.middleware import Middleware

    return [Middleware(GuardedPage)]
