"""The `tuneplan` command: the entry point, the exit statuses, and the one place failures are printed.

The typer app (``cli/root.py``) lists every command and loads a command's module on first use. The
commands of ``CLICK_COMMANDS`` are built with click directly from flag rows (``cli/flags.py``) and run
without loading typer: typer 0.2x builds a pydantic validator for every option it parses, which costs more
start-up than the estimate itself (``benchmarks/cli_startup.py`` measures it).
"""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any

from tuneplan.errors import TuneplanError

# Commands in help order, and the module that registers each (``register(app)``). A module is imported only
# when one of its commands runs, or for the full help: `tuneplan estimate --json` loads neither the
# planner, the web page, the simulator nor the tables of the other commands.
COMMANDS: dict[str, str] = {
    "estimate": "tuneplan.cli.estimate_cmd",
    "models": "tuneplan.cli.catalog_cmd",
    "table": "tuneplan.cli.catalog_cmd",
    "fit": "tuneplan.cli.plan_cmd",
    "gpus": "tuneplan.cli.plan_cmd",
    "max-model": "tuneplan.cli.plan_cmd",
    "sweep": "tuneplan.cli.plan_cmd",
    "compare": "tuneplan.cli.compare_cmd",
    "measure": "tuneplan.cli.measure_cmd",
    "calibration": "tuneplan.cli.measure_cmd",
    "simulate": "tuneplan.cli.simulate_cmd",
    "deploy": "tuneplan.cli.deploy_cmd",
    "export": "tuneplan.cli.export_cmd",
    "serve": "tuneplan.cli.serve_cmd",
    "doctor": "tuneplan.cli.doctor_cmd",
    "accelerators": "tuneplan.cli.doctor_cmd",
}
COMMAND_MODULES = tuple(dict.fromkeys(COMMANDS.values()))
# The commands built with click directly: each module has ``command()`` instead of ``register(app)``.
CLICK_COMMANDS: dict[str, str] = {"estimate": "tuneplan.cli.estimate_cmd"}


def __getattr__(name: str) -> Any:  # ``app``: the typer app, imported (with typer) when asked for
    if name == "app":
        from tuneplan.cli.root import app

        return app
    raise AttributeError(name)


# Exit status, one meaning each (README "Exit status").
EXIT_OK, EXIT_NO_FIT, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
# 128 + SIGINT: what a shell reports for a command stopped by Ctrl-C
EXIT_INTERRUPTED = 130
REPORT_HINT = ("this is a bug in tuneplan: please report it with the command line "
               "(run again with --debug for details)")


def _split_debug(args: list[str]) -> tuple[list[str], bool]:
    """``--debug`` is global: taken out wherever it stands and never seen by the commands."""
    return [a for a in args if a != "--debug"], "--debug" in args


@functools.lru_cache(maxsize=1)
def _command() -> Any:
    """The click command typer builds from ``app``, built once per process (~0.1 s each time otherwise)."""
    import typer

    from tuneplan.cli.root import app

    return typer.main.get_command(app)


def _entry(args: list[str]) -> tuple[Any, list[str], str]:
    """The command that parses ``args``: a command of CLICK_COMMANDS directly (with the ``click`` package),
    else the typer app; the arguments it parses and its name in usage lines."""
    if args and args[0] in CLICK_COMMANDS:
        return importlib.import_module(CLICK_COMMANDS[args[0]]).command(), args[1:], f"tuneplan {args[0]}"
    return _command(), args, "tuneplan"


def _fail(kind: str, message: str, code: int, *, as_json: bool, err: TuneplanError | None = None) -> int:
    """The one place a failure is printed: a JSON error object on stdout with --json, one line on stderr.

    ``{"error": {"kind": "bad_input" | "internal", "field", "message", "accepted", "suggestions"}}``
    """
    from tuneplan.cli.render import error_text, flag_words, for_terminal

    if as_json:
        import json

        accepted = err.parts(flag_words)[2] if err else None
        obj = {"kind": kind, "field": err.field if err else None,
               "message": err.parts(flag_words)[1] if err else message,
               "accepted": accepted, "suggestions": list(err.suggestions) if err else []}
        print(json.dumps({"error": obj}, allow_nan=False, default=str))
    else:
        print(f"error: {for_terminal(error_text(err) if err is not None else message)}", file=sys.stderr)
    return code


def _named(usage: Any) -> TuneplanError | None:
    """A value of the wrong type (click's BadParameter) as an error naming the field and what it accepts."""
    param = getattr(usage, "param", None)
    if param is None or not getattr(param, "name", None):
        return None
    kind = getattr(getattr(param, "type", None), "name", "")
    return TuneplanError(usage.format_message(), field=param.name,
                         accepted={"integer": "an integer", "float": "a number"}.get(kind))


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _click_kinds() -> tuple[tuple[type[Exception], ...], tuple[type[Exception], ...]]:
    """Usage-error and exit classes: typer >= 0.20 carries its own copy of click, older typer uses click.
    Typer's are looked up only when typer is loaded (a command of CLICK_COMMANDS runs without it)."""
    usage: list[type[Exception]] = []
    exits: list[type[Exception]] = []
    if "typer" in sys.modules:
        import typer

        exits.append(typer.Exit)  # what typer's copy of click raises for --help and ctx.exit
        try:
            from typer._click.exceptions import ClickException as VendoredClickException

            usage.append(VendoredClickException)
        except ImportError:
            pass
    try:
        import click

        usage.append(click.ClickException)
        exits.append(click.exceptions.Exit)
    except ImportError:  # pragma: no cover - typer without click
        pass
    return tuple(usage), tuple(exits)


def _invoke(command: Any, rest: list[str], prog: str) -> Any:
    """Parse and run the command. Not ``command.main``: click's and typer's main turn Ctrl-C into
    "Aborted!" (exit 1) in one and a silent 130 in the other, and a closed pipe into exit 1; here they reach
    :func:`run` as KeyboardInterrupt and BrokenPipeError, handled once for every command."""
    with command.make_context(prog, rest) as ctx:
        return command.invoke(ctx)


def _say(text: str) -> None:
    """One line on stderr, when stderr can still be written."""
    from tuneplan.cli.streams import OutputError

    try:
        print(text, file=sys.stderr)
    except (OSError, OutputError):
        pass


def run(args: list[str]) -> int:
    """Run one command line; the exit status: 0 fits, 1 does not fit / cannot run, 2 bad input, 3 internal,
    130 interrupted (Ctrl-C). A reader that leaves early (``| head``) ends the command quietly with 0."""
    from tuneplan.cli.streams import OutputError

    args, debug = _split_debug(args)
    as_json = "--json" in args
    bad = next((i for i, a in enumerate(args) if "\x00" in a or not _encodable(a)), None)
    if bad is not None:  # no shell passes these; refused before any path or name is built from them
        return _fail("bad_input", f"argument {bad + 1} contains a NUL character or bytes that are not UTF-8",
                     EXIT_BAD_INPUT, as_json=as_json)
    usage_errors: tuple[type[Exception], ...] = ()
    exits: tuple[type[Exception], ...] = ()
    try:
        try:
            command, rest, prog = _entry(args)
            usage_errors, exits = _click_kinds()
            with _warnings_as_lines():
                rv = _invoke(command, rest, prog)
        except TuneplanError as exc:
            return _fail("bad_input", exc.message, EXIT_BAD_INPUT, as_json=as_json, err=exc)
        except exits as caught:  # --help, --version, a command's typer.Exit(code)
            return int(getattr(caught, "exit_code", EXIT_OK) or EXIT_OK)
        except usage_errors as caught:  # an unknown flag, a value of the wrong type; bare `tuneplan`: help
            usage: Any = caught  # a ClickException (typer's vendored copy or click's own): both have these
            if as_json and type(usage).__name__ != "NoArgsIsHelpError":
                return _fail("bad_input", usage.format_message(), EXIT_BAD_INPUT, as_json=True,
                             err=_named(usage))
            usage.show()
            return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        _say("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `tuneplan ... | head`: the reader left; nothing to report
        from tuneplan.cli.streams import quiet_closed_stdout

        quiet_closed_stdout()
        return EXIT_OK
    except OutputError as exc:  # stdout on a full disk, /dev/full: not a defect, and not for stdout
        _say(f"error: {exc}")
        return EXIT_BAD_INPUT
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, never a traceback
        if debug:
            import traceback

            traceback.print_exc()
        text = str(exc).splitlines()[0][:300] if str(exc) else ""
        try:
            return _fail("internal", f"{type(exc).__name__}{': ' + text if text else ''}; {REPORT_HINT}",
                         EXIT_INTERNAL, as_json=as_json)
        except (OSError, OutputError):  # the report itself cannot be written
            return EXIT_INTERNAL
    return rv if isinstance(rv, int) else EXIT_OK


def _warnings_as_lines() -> Any:
    """Python warnings raised while a command runs, printed as ``warning: <text>`` on stderr (no source
    path, no code line), the text cleaned of terminal control sequences (``render.for_terminal``)."""
    import contextlib
    import warnings

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
             line: Any = None) -> None:
        from tuneplan.cli.render import for_terminal
        from tuneplan.cli.wording import cli_texts

        _say(f"warning: {for_terminal(cli_texts(str(message)))}")  # the core's {field} references as flags

    @contextlib.contextmanager
    def scope() -> Any:
        with warnings.catch_warnings():
            warnings.showwarning = show
            yield

    return scope()


def main(argv: list[str] | None = None) -> None:
    """Console entry point; the exit status of :func:`run`. ``--debug`` anywhere prints tracebacks.

    The streams are guarded first (``cli/streams``: ASCII where the encoding needs it, a failed write
    named as such), and flushed here, so that a full disk is reported rather than lost at exit."""
    from tuneplan.cli.streams import OutputError, flush_streams, guard_streams, quiet_closed_stdout

    guard_streams()
    code = run(list(sys.argv[1:] if argv is None else argv))
    try:
        flush_streams()
    except BrokenPipeError:
        quiet_closed_stdout()
    except OutputError as exc:
        _say(f"error: {exc}")
        code = EXIT_BAD_INPUT  # what was printed is lost: no verdict a script could act on
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()
