"""Reading a file the user named, within limits: size, text encoding, nesting depth, YAML aliases.

Every reader of a user file (model config.json, ``--from`` training configs, ``--hardware-file``,
``doctor --machine``) goes through here, so that a hostile or careless file gets a TuneplanError naming
the file and what is accepted (exit 2), never a traceback, a hang or a memory blow-up:

- size: at most ``limits.MAX_FILE_BYTES``, checked before reading;
- text: UTF-8 (a leading BOM is dropped), no NUL bytes;
- JSON: ``NaN`` / ``Infinity`` are not JSON and are refused; nesting at most ``limits.MAX_NESTING``;
- nesting depth, the same for JSON, YAML and TOML, counts containers only: a scalar is 0 levels, a
  mapping or list is one more than its deepest value (``1`` is 0, ``[1]`` and ``[]`` are 1,
  ``{"a": [1]}`` is 2), so one document is accepted or refused alike whichever syntax spells it;
- YAML: the node graph is measured before it is constructed: a document whose aliases expand to more
  than ``limits.MAX_YAML_NODES`` nodes ("billion laughs"), a recursive alias, or nesting deeper than
  ``limits.MAX_NESTING`` is refused. PyYAML's composer recurses per level; a RecursionError from a
  pathological document is turned into the same refusal.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from tuneplan.errors import TuneplanError
from tuneplan.specs.limits import (
    MAX_FILE_BYTES,
    MAX_NAME_CHARS,
    MAX_NAME_COMPONENT,
    MAX_NESTING,
    MAX_YAML_NODES,
)


def user_path(name: str, field: str) -> Path:
    """A path the user typed, ``~`` expanded; a name no file system accepts is refused, not raised."""
    if "\x00" in name:
        raise TuneplanError("a path cannot contain a NUL character", field=field)
    if len(name) > MAX_NAME_CHARS:
        raise TuneplanError(f"a name of {len(name)} characters is longer than any path allows", field=field,
                            accepted=f"at most {MAX_NAME_CHARS} characters")
    if any(len(part.encode("utf-8", "surrogatepass")) > MAX_NAME_COMPONENT for part in name.split("/")):
        raise TuneplanError(f"a path component is longer than {MAX_NAME_COMPONENT} bytes", field=field,
                            accepted=f"file and folder names of at most {MAX_NAME_COMPONENT} bytes")
    try:
        return Path(name).expanduser()
    except (RuntimeError, KeyError):  # "~nosuchuser/x": no such home directory
        raise TuneplanError(f"{name.split('/')[0]!r} names no user with a home directory", field=field,
                            accepted="a path (write ./~name for a file whose name starts with ~)") from None


def path_exists(p: Path) -> bool:
    """``Path.exists`` that treats an unreadable or impossible path as absent instead of raising."""
    try:
        return p.exists()
    except (OSError, ValueError):
        return False


def read_text(path: str | Path, field: str, *, accepted: str = "a UTF-8 text file") -> str:
    """The text of a regular file of at most MAX_FILE_BYTES, UTF-8 (BOM dropped), without NUL bytes."""
    p = Path(path)
    try:
        st = os.stat(p)
        if stat.S_ISDIR(st.st_mode):
            raise TuneplanError(f"{p} is a folder", field=field, accepted=accepted)
        if not stat.S_ISREG(st.st_mode):
            raise TuneplanError(f"{p} is not a regular file", field=field, accepted=accepted)
        if st.st_size > MAX_FILE_BYTES:
            raise TuneplanError(f"{p} is {st.st_size:,} bytes; larger than any config file", field=field,
                                accepted=f"a file of at most {MAX_FILE_BYTES // 1024 // 1024} MiB")
        # O_NONBLOCK: a FIFO swapped in after the stat cannot block the open; fstat checks what was opened
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise TuneplanError(f"{p} is not a regular file", field=field, accepted=accepted)
            raw = f.read(MAX_FILE_BYTES + 1)
    except TuneplanError:
        raise
    except (OSError, ValueError) as exc:
        raise TuneplanError(f"cannot read {p}: {getattr(exc, 'strerror', None) or exc}", field=field,
                            accepted=accepted) from None
    if len(raw) > MAX_FILE_BYTES:
        raise TuneplanError(f"{p} is larger than any config file", field=field,
                            accepted=f"a file of at most {MAX_FILE_BYTES // 1024 // 1024} MiB")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise TuneplanError(f"{p} is not a UTF-8 text file (binary?)", field=field,
                            accepted=accepted) from None
    if "\x00" in text:
        raise TuneplanError(f"{p} contains NUL bytes (binary?)", field=field, accepted=accepted)
    return text


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(text: str, field: str, shown: str) -> Any:
    """``json.loads`` refusing NaN/Infinity, huge integers and deep nesting, with a message naming the
    file."""
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise TuneplanError(f"{shown}:{exc.lineno}: not valid JSON (column {exc.colno}: {exc.msg})",
                            field=field) from None
    except RecursionError:
        raise TuneplanError(f"{shown}: nested deeper than {MAX_NESTING} levels", field=field,
                            accepted=f"at most {MAX_NESTING} levels of objects and arrays") from None
    except ValueError as exc:  # NaN / Infinity, or an integer of more than 4300 digits
        raise TuneplanError(f"{shown}: not valid JSON ({exc})", field=field,
                            accepted="finite numbers (NaN and Infinity are not JSON)") from None
    check_depth(data, field, shown)
    return data


def check_depth(data: Any, field: str, shown: str) -> None:
    """Refuse a parsed structure nested deeper than MAX_NESTING containers (walked without recursion)."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    seen: set[int] = set()
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        if depth > MAX_NESTING:
            raise TuneplanError(f"{shown}: nested deeper than {MAX_NESTING} levels", field=field,
                                accepted=f"at most {MAX_NESTING} levels of mappings and lists")
        if id(node) in seen:  # a shared (aliased) YAML node is measured once
            continue
        seen.add(id(node))
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children)


def compose_yaml(text: str, field: str, shown: str) -> Any:
    """The YAML node graph of a document, refused if it is a bomb, recursive or too deep; None if empty."""
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{shown}:{mark.line + 1}" if mark else shown
        raise TuneplanError(f"{where}: not valid YAML ({exc.problem or exc.context})", field=field) from None
    except yaml.YAMLError as exc:
        raise TuneplanError(f"{shown}: not valid YAML ({exc})", field=field) from None
    except RecursionError:
        raise TuneplanError(f"{shown}: nested deeper than {MAX_NESTING} levels", field=field,
                            accepted=f"at most {MAX_NESTING} levels of mappings and lists") from None
    if node is not None:
        _measure_yaml(node, field, shown)
    return node


def _measure_yaml(root: Any, field: str, shown: str) -> None:
    """Expanded node count (every alias counted as the copy it stands for) and depth, without recursion.

    size(node) = 1 + sum(size(child)); depth(node) = 1 + max(depth(child)) for a mapping or sequence and 0
    for a scalar (containers only, as :func:`check_depth` counts); both memoised by node, so a bomb of n
    aliases costs O(n) to measure however large its expansion is.
    """
    import yaml

    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()

    def children(n: Any) -> list[Any]:
        if isinstance(n, yaml.MappingNode):
            return [x for kv in n.value for x in kv]
        if isinstance(n, yaml.SequenceNode):
            return list(n.value)
        return []

    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        n, done = stack.pop()
        k = id(n)
        if done:
            kids = children(n)
            size[k] = 1 + sum(size[id(c)] for c in kids)
            is_container = isinstance(n, (yaml.MappingNode, yaml.SequenceNode))
            depth[k] = 1 + max((depth[id(c)] for c in kids), default=0) if is_container else 0
            on_path.discard(k)
            if size[k] > MAX_YAML_NODES:
                raise TuneplanError(f"{shown}: its aliases expand to more than {MAX_YAML_NODES:,} values",
                                    field=field, accepted="a config file without alias bombs")
            if depth[k] > MAX_NESTING:
                raise TuneplanError(f"{shown}: nested deeper than {MAX_NESTING} levels", field=field,
                                    accepted=f"at most {MAX_NESTING} levels of mappings and lists")
            continue
        if k in size:
            continue
        if k in on_path:
            raise TuneplanError(f"{shown}: an alias refers to a value that contains it (recursive alias)",
                                field=field, accepted="a config file without recursive aliases")
        on_path.add(k)
        stack.append((n, True))
        stack.extend((c, False) for c in children(n) if id(c) not in size)


def parse_yaml(text: str, field: str, shown: str) -> tuple[Any, Any]:
    """(data, node) of a YAML document measured by :func:`compose_yaml` first; data None when empty."""
    import yaml

    node = compose_yaml(text, field, shown)
    if node is None:
        return None, None
    try:
        data = yaml.SafeLoader(text).construct_document(node)
    except yaml.YAMLError as exc:
        raise TuneplanError(f"{shown}: not valid YAML ({exc})", field=field) from None
    except (RecursionError, ValueError, TypeError) as exc:  # e.g. an unhashable mapping key
        raise TuneplanError(f"{shown}: cannot read this YAML ({type(exc).__name__})", field=field) from None
    return data, node


def parse_toml(text: str, field: str, shown: str) -> Any:
    """A TOML document; NaN/inf are legal TOML and left to the field checks; deep nesting is refused."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the tomli backport has the same API
        # no-redef fires only where tomli is installed (Python 3.10); elsewhere the ignore is unused
        import tomli as tomllib  # type: ignore[no-redef, unused-ignore]
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TuneplanError(f"{shown}: not valid TOML: {exc}", field=field) from None
    except RecursionError:
        raise TuneplanError(f"{shown}: nested deeper than {MAX_NESTING} levels", field=field,
                            accepted=f"at most {MAX_NESTING} levels of tables and arrays") from None
    check_depth(data, field, shown)
    return data
