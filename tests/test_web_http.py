"""The served page's HTTP layer, over a real socket: security headers on every response, and a request
body over the cap refused with 413 before it is read whole (declared or chunked)."""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import time

import pytest

pytest.importorskip("gradio", reason="the web extra is not installed (pip install -e '.[web]')")

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def port():
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from tuneplan.web import launch

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    demo = launch("127.0.0.1", free, block=False, quiet=True)
    try:
        yield free
    finally:
        demo.close()


def request(port: int, method: str, path: str, body=None, headers=None, chunked: bool = False):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        c.request(method, path, body=body, headers=headers or {}, encode_chunked=chunked)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


@pytest.mark.parametrize("path", ["/", "/config", "/gradio_api/info", "/no-such-page"])
def test_every_response_carries_the_security_headers(port, path):
    status, headers, _ = request(port, "GET", path)
    assert status in (200, 404)
    assert headers["x-frame-options"] == "DENY"
    assert headers["x-content-type-options"] == "nosniff"
    csp = headers["content-security-policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["frame-ancestors"] == "'none'" and directives["object-src"] == "'none'"
    assert directives["default-src"] == "'self'" and directives["connect-src"] == "'self'"
    assert "*" not in csp and "http" not in csp  # nothing from another origin


def test_a_page_asset_carries_them_too(port):
    _, _, html = request(port, "GET", "/")
    script = re.search(rb'<script type="module" crossorigin src="\./(assets/[^"]+\.js)"', html)
    assert script is not None
    status, headers, _ = request(port, "GET", "/" + script.group(1).decode())
    assert status == 200 and headers["x-content-type-options"] == "nosniff"


def test_a_declared_50_mib_body_is_refused_before_it_is_read(port):
    from tuneplan.web.http import BODY_MAX_BYTES

    assert BODY_MAX_BYTES == 2 * MIB
    t0 = time.monotonic()
    status, headers, body = request(port, "POST", "/gradio_api/queue/join", body=b"x" * (50 * MIB),
                                    headers={"Content-Type": "application/json"})
    assert status == 413 and b"2048 KiB" in body
    assert headers["x-frame-options"] == "DENY"
    assert time.monotonic() - t0 < 30


def test_a_chunked_body_is_cut_off_at_the_cap(port):
    def chunks():
        yield b'{"data": ["'
        for _ in range(50):
            yield b"y" * MIB

    status, _, body = request(port, "POST", "/gradio_api/queue/join", body=chunks(),
                              headers={"Content-Type": "application/json"}, chunked=True)
    assert status == 413 and b"2048 KiB" in body


def test_a_body_under_the_cap_is_served(port):
    """A 1 MiB JSON call (a 512 KiB paste of quotes doubles when encoded) reaches the app: whatever it
    answers, it is not the cap's 413."""
    payload = json.dumps({"data": ['"' * (512 * 1024)], "fn_index": 0, "session_hash": "abc"}).encode()
    assert MIB < len(payload) < 2 * MIB
    status, _, _ = request(port, "POST", "/gradio_api/queue/join", body=payload,
                           headers={"Content-Type": "application/json"})
    assert status != 413
