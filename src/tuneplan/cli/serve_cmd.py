"""`tuneplan serve`: the web page (``tuneplan.web``), on loopback unless told otherwise."""

from __future__ import annotations

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
        typer.echo(f"tuneplan web page on http://{host}:{port}/ (Ctrl+C to stop)")
        try:
            launch(host, port, block=True, quiet=True)
        except OSError as exc:  # port taken, address not on this machine
            raise TuneplanError(f"cannot listen on {host}:{port} ({exc})", field="port",
                                accepted="a free port (--port) on an address of this machine (--host)") from None


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
