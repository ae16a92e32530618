"""A training config file read as a mapping, with the line of every key.

Every message about a file names ``path:line`` (or ``path:key`` when no line is known), so a user can
jump to the key. YAML lines come from PyYAML's node marks; JSON is parsed by the json module and the key
lines by a small scan of its tokens (the json module keeps no positions). A file that cannot be read or
parsed raises a TuneplanError naming the file and line, never a traceback.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuneplan.errors import ConfigError

KeyPath = tuple[Any, ...]

_JSON_TOKEN = re.compile(r'"(?:[^"\\\n]|\\.)*"|[{}\[\]:,]|\n|[-\w.+]+')


@dataclass
class Document:
    path: str
    data: dict[str, Any]
    fmt: str  # "yaml" or "json"
    lines: dict[KeyPath, int] = field(default_factory=dict)

    def line(self, *key: Any) -> int | None:
        return self.lines.get(tuple(key))

    def where(self, *key: Any) -> str:
        """``path:line`` of a key, or ``path:dotted.key`` when its line is unknown."""
        n = self.line(*key)
        return f"{self.path}:{n}" if n else f"{self.path}:{'.'.join(map(str, key))}"

    @property
    def folder(self) -> Path:
        return Path(self.path).parent


def _yaml_lines(node: Any, prefix: KeyPath, out: dict[KeyPath, int]) -> None:
    import yaml

    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = (*prefix, k.value)
            out.setdefault(key, k.start_mark.line + 1)
            _yaml_lines(v, key, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            key = (*prefix, i)
            out.setdefault(key, v.start_mark.line + 1)
            _yaml_lines(v, key, out)


def json_key_lines(text: str) -> dict[KeyPath, int]:
    """Line of every object key and array item of a valid JSON text, by key path."""
    out: dict[KeyPath, int] = {}
    stack: list[list[Any]] = []  # [kind "obj"|"arr", current key or index, item started]
    line = 1
    pending: tuple[str, int] | None = None

    def start_value() -> None:
        if stack and stack[-1][0] == "arr" and not stack[-1][2]:
            stack[-1][2] = True
            out.setdefault(tuple(s[1] for s in stack), line)

    for m in _JSON_TOKEN.finditer(text):
        t = m.group()
        if t == "\n":
            line += 1
        elif t == ":":
            if pending is not None and stack:
                stack[-1][1] = pending[0]
                out.setdefault(tuple(s[1] for s in stack), pending[1])
            pending = None
        elif t in "{[":
            start_value()
            stack.append(["obj", None, False] if t == "{" else ["arr", 0, False])
        elif t in "}]":
            if stack:
                stack.pop()
        elif t == ",":
            if stack and stack[-1][0] == "arr":
                stack[-1][1] += 1
                stack[-1][2] = False
        else:  # a string (maybe a key) or a literal
            start_value()
            pending = (json.loads(t), line) if t.startswith('"') else None
    return out


def load_document(path: str | Path) -> Document:
    """Read a YAML or JSON config file; raise ConfigError naming file and line on any problem."""
    p = Path(path).expanduser()
    shown = str(path)
    if not p.exists():
        raise ConfigError(f"no such file: {shown}", field="--from")
    if p.is_dir():
        raise ConfigError(f"{shown} is a folder; give the config file inside it", field="--from")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{shown} is not a UTF-8 text file", field="--from",
                          accepted="a YAML or JSON training config") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {shown}: {exc.strerror}", field="--from") from None
    if not text.strip():
        raise ConfigError(f"{shown} is empty", field="--from", accepted="a YAML or JSON training config")
    is_json = p.suffix.lower() == ".json" or text.lstrip().startswith("{")
    if is_json:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{shown}:{exc.lineno}: not valid JSON (column {exc.colno}: {exc.msg})",
                              field="--from") from None
        lines = json_key_lines(text) if isinstance(data, dict) else {}
        fmt = "json"
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
            node = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            where = f"{shown}:{mark.line + 1}" if mark else shown
            raise ConfigError(f"{where}: not valid YAML ({exc.problem or exc.context})", field="--from") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{shown}: not valid YAML ({exc})", field="--from") from None
        lines = {}
        _yaml_lines(node, (), lines)
        fmt = "yaml"
    if not isinstance(data, dict):
        raise ConfigError(f"{shown}: the top level must be a mapping of keys to values, got {type(data).__name__}",
                          field="--from", accepted="a YAML or JSON training config")
    return Document(path=shown, data=data, fmt=fmt, lines=lines)
