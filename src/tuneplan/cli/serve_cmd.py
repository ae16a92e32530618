"""`tuneplan serve`: the web page (``tuneplan.web``), on loopback unless told otherwise."""

from __future__ import annotations

import time
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve_cmd(
        host: Annotated[str, typer.Option("--host", help="address to listen on; 0.0.0.0 exposes the page "
                                                        "to your network")] = "127.0.0.1",
        port: Annotated[int, typer.Option("--port", help="TCP port")] = 7860,
    ) -> None:
        r"""The planner as a web page: pick a model, method and GPU; verdict, chart, findings update live.

        Needs the `web` extra: pip install 'tuneplan\[web]'.
        """
        from tuneplan.errors import TuneplanError

        if not 0 < port < 65536:
            raise TuneplanError(f"got {port}", field="port", accepted="1..65535")
        from tuneplan.web import launch, require_gradio

        _check_free(host, port)
        require_gradio()
        if not is_loopback(host):
            typer.echo(exposure_warning(host, port), err=True)
        typer.echo(f"tuneplan web page on http://{host}:{port}/ (Ctrl+C to stop)")
        try:
            demo = launch(host, port, block=False, quiet=True)
        except OSError as exc:  # port taken, address not on this machine
            raise TuneplanError(f"cannot listen on {host}:{port} ({exc})", field="port",
                                accepted="a free port (--port) on an address of this machine (--host)"
                                ) from None
        # Not Gradio's own blocking wait, which takes Ctrl-C as a normal end (exit 0): here it reaches the
        # command line's handler and exits 130 as in every other command, the server closed first.
        try:
            wait_for_interrupt()
        finally:
            demo.close()


def wait_for_interrupt() -> None:
    """Sleep until Ctrl-C (KeyboardInterrupt) ends the command."""
    while True:
        time.sleep(3600)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def exposure_warning(host: str, port: int) -> str:
    """What serving on a non-loopback address exposes, said before the server starts."""
    from tuneplan.web.limits import PASTE_MAX_BYTES, SESSIONS_MAX

    return (f"warning: --host {host} exposes the page to every machine that can reach this one on port "
            f"{port}, with no login. Anyone there can run estimates and planner searches (each request "
            "bounded in size), make this server fetch public config.json files from the Hugging Face Hub "
            "(anonymously: your Hugging Face token and cache are not used), upload a config.json (at most "
            f"{PASTE_MAX_BYTES // 1024} KiB, kept in memory), and download recipe files written to a "
            "private temporary folder. The page opens no file a visitor names on this machine; it keeps at "
            f"most {SESSIONS_MAX} sessions. Use --host 127.0.0.1 to keep it on this machine, or put it "
            "behind a proxy that authenticates.")


def _check_free(host: str, port: int) -> None:
    """Fail in a second, before building the page, when the address cannot be listened on."""
    import socket

    from tuneplan.errors import TuneplanError

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.bind((host, port))
    except OSError as exc:
        raise TuneplanError(f"cannot listen on {host}:{port} ({exc.strerror or exc})", field="port",
                            accepted="a free port (--port) on an address of this machine (--host)") from None
