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
    """Line of every key and list item, walking each node once: an alias is not followed again (a
    "billion laughs" document would otherwise be walked in full), and no recursion (depth is bounded
    by safe_read, but a walk without recursion needs no bound)."""
    import yaml

    seen: set[int] = set()
    stack: list[tuple[Any, KeyPath]] = [(node, prefix)]
    while stack:  # depth first in document order: an anchored node is walked where it is defined
        n, pre = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        children: list[tuple[Any, KeyPath]] = []
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                key = (*pre, k.value)
                out.setdefault(key, k.start_mark.line + 1)
                children.append((v, key))
        elif isinstance(n, yaml.SequenceNode):
            for i, v in enumerate(n.value):
                key = (*pre, i)
                out.setdefault(key, v.start_mark.line + 1)
                children.append((v, key))
        stack.extend(reversed(children))


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
    """Read a YAML or JSON config file; raise ConfigError naming file and line on any problem.

    Size, encoding, nesting and YAML aliases are bounded by :mod:`tuneplan.safe_read`."""
    from tuneplan.errors import TuneplanError
    from tuneplan.safe_read import parse_json, parse_yaml, path_exists, read_text, user_path

    shown = str(path)
    p = user_path(shown, "from") if isinstance(path, str) else Path(path)
    if not path_exists(p):
        raise ConfigError(f"no such file: {shown}", field="from", field_is_key=False)
    if p.is_dir():
        raise ConfigError(f"{shown} is a folder; give the config file inside it", field="from",
                          field_is_key=False)
    try:
        text = read_text(p, "from", accepted="a YAML or JSON training config")
        if not text.strip():
            raise ConfigError(f"{shown} is empty", field="from", field_is_key=False,
                              accepted="a YAML or JSON training config")
        is_json = p.suffix.lower() == ".json" or text.lstrip().startswith("{")
        if is_json:
            data = parse_json(text, "from", shown)
            lines = json_key_lines(text) if isinstance(data, dict) else {}
            fmt = "json"
        else:
            data, node = parse_yaml(text, "from", shown)
            lines = {}
            if node is not None:
                _yaml_lines(node, (), lines)
            fmt = "yaml"
    except ConfigError:
        raise
    except TuneplanError as exc:  # the readers' refusals, as the ConfigError callers expect
        raise ConfigError(exc.message, field=exc.field, accepted=exc.accepted, field_is_key=False) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{shown}: the top level must be a mapping of keys to values, got "
                          f"{type(data).__name__}",
                          field="from", field_is_key=False, accepted="a YAML or JSON training config")
    return Document(path=shown, data=data, fmt=fmt, lines=lines)
