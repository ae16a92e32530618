"""The page's handlers under hostile input: no server file read, no exception, no long request.

The handlers are called directly (no browser, no gradio), as a request would call them, with what an
attacker or a careless user sends: paths (relative, ``../``, ``~user``, absolute), a private repo
planted in a Hugging Face cache that the environment points at, configs with 10^9 layers, negative or
NaN sizes, megabytes of text, 100,000 levels of nesting, binary uploads, and numbers that are not
numbers. Each test runs in a sandbox folder (the working directory) full of canary files, with file
access spied on: the page must not open, stat or list any of them, and the word CANARY must never
reach an answer. The random forms come from a fixed generator, so a failure reproduces.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

from tuneplan.errors import TuneplanError
from tuneplan.web import callbacks, exports, form, limits, plans, sources
from tuneplan.web.form import DEFAULTS
from tuneplan.web.wording import LABELS

HANDLER_MAX_S = 5.0  # one request; the slowest legitimate one (the GPU ranking) takes about 1 s here
CANARY = "CANARY"
CANARY_CONFIG = {"_name_or_path": "CANARY-model", "model_type": "llama", "hidden_size": 64,
                 "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                 "num_key_value_heads": 4, "vocab_size": 1000}


def hostile_config(**changes: Any) -> str:
    return json.dumps({**CANARY_CONFIG, "_name_or_path": "pasted", **changes})


NAMES = ["etc/passwd", "../etc/passwd", "./etc/passwd", "etc", "models", "models/config.json", "org/private",
         "acme/private", "~root/.ssh/id_rsa", "~nosuchuser/x", "~/x", "/etc/passwd", "C:\\Windows\\x",
         "\\\\host\\x", "file:///etc/passwd", "http://127.0.0.1/x", "..", ".", "../../../../", "org/..",
         "a--b/c", "x" * 300, "a/" * 200, "\x00", "org/na\x00me", "😀/😀", "", " ", None, 123, ["etc/passwd"],
         {"a": 1}, "qwen2.5-7b", "config.json", "etc/passwd.json", "CON", "nul/aux"]
CONFIG_TEXTS = [
    hostile_config(num_hidden_layers=10**9), hostile_config(num_hidden_layers=-1),
    hostile_config(intermediate_size=-14336), hostile_config(moe_layer_freq=0, num_local_experts=8),
    hostile_config(hidden_size=1e300), hostile_config(vocab_size=10**30),
    hostile_config(num_local_experts=10**6),
    hostile_config(num_hidden_layers="abc"), hostile_config(num_hidden_layers=[1, 2]),
    hostile_config(num_hidden_layers=True), hostile_config(hidden_size=64.5),
    json.dumps({"model_type": "llava", "text_config": {**CANARY_CONFIG, "num_hidden_layers": 10**9}}),
    '{"hidden_size": NaN, "num_hidden_layers": 2}', '{"num_hidden_layers": Infinity}',
    '{"num_hidden_layers": -Infinity}', '{"num_hidden_layers": ' + "9" * 5000 + "}",
    "[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000, " " * (limits.PASTE_MAX_BYTES + 10),
    '{"x": "' + "y" * (limits.PASTE_MAX_BYTES + 10) + '"}', "\x00\x01\x02", "\ufeff{}", "[]", "null", "1",
    '"s"', "{", "{}", '{"model_type": 5}', "etc/passwd", "/etc/passwd",
    '"\\' * 170_000, '\\"' * 250_000, '"' * 500_000,  # a naive string pattern rescans these: quadratic
]
NUMBERS = [-1, 0, 1, 3, 2**31, 10**9, 10**400, 1e308, float("nan"), float("inf"), float("-inf"), "1e999",
           "abc", None, "", True, False, [], {}, "NaN", 16.5, " 7 ", "0x10", b"12", "9" * 5000]
TEXTS = ["../x", "x" * 10_000, None, 5, [], "qlora", "all-linear", "\x00", "profile default", "on", "zzz"]
NUMBER_FIELDS = ("rank", "batch", "seq", "grad_accum", "gpus", "nodes", "samples", "epochs", "avg_tokens",
                 "num_labels", "bits", "zero")
TEXT_FIELDS = ("method", "targets", "precision", "optimizer", "gradient_checkpointing", "attn", "loss",
               "framework", "gpu", "offload")


WARM: list[bool] = []


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A working directory of canary files, a planted Hugging Face cache, and a spy on file access."""
    # Warm every lazy import and cache first, so the spy sees only what hostile input makes the page do.
    if not WARM:
        callbacks.estimate_view(dict(DEFAULTS))
        plans.fit_view(dict(DEFAULTS))
        plans.deploy_view(dict(DEFAULTS))
        WARM.append(True)
    root = tmp_path / "server"
    for rel in ("etc/passwd", "models/config.json", "org/private/config.json", "config.json",
                "etc/passwd.json"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(json.dumps(CANARY_CONFIG))
    hub = tmp_path / "hf" / "hub" / "models--acme--private"
    (hub / "refs").mkdir(parents=True)
    (hub / "refs" / "main").write_text("0" * 40)
    (hub / "snapshots" / ("0" * 40)).mkdir(parents=True)
    (hub / "snapshots" / ("0" * 40) / "config.json").write_text(json.dumps(CANARY_CONFIG))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setenv("HF_TOKEN", "hf_CANARYtoken")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the tests never reach the network
    monkeypatch.chdir(root)
    touched: list[str] = []
    guarded = (str(tmp_path),)

    def spy(real: Any) -> Any:
        def wrapper(path: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(path, (str, bytes, os.PathLike)):
                p = os.fsdecode(path)
                full = os.path.abspath(p) if isinstance(path, (str, os.PathLike)) else p
                if not os.path.isabs(p) or full.startswith(guarded):
                    touched.append(p)
            return real(path, *args, **kwargs)

        return wrapper

    for mod, name in ((builtins, "open"), (io, "open"), (os, "open"), (os, "stat"), (os, "lstat"),
                      (os, "listdir"), (os, "scandir")):
        monkeypatch.setattr(mod, name, spy(getattr(mod, name)))
    yield touched
    monkeypatch.undo()


def answers(result: Any) -> str:
    return json.dumps(result, default=str)


def timed(fn: Any, *args: Any) -> Any:
    t = time.perf_counter()
    out = fn(*args)
    took = time.perf_counter() - t
    assert took < HANDLER_MAX_S, f"{fn.__name__} took {took:.1f} s on {str(args)[:200]}"
    return out


def assert_clean(out: Any) -> None:
    text = answers(out)
    assert CANARY not in text and "canary" not in text.lower()
    assert "internal error" not in text, text[:600]


@pytest.mark.parametrize("name", NAMES, ids=repr)
def test_a_model_name_never_reads_the_server_disk(sandbox, name) -> None:
    out = timed(callbacks.estimate_view, {**DEFAULTS, "model": name})
    assert_clean(out)
    assert sandbox == [], f"{name!r} made the page touch {sandbox}"
    if name != "qwen2.5-7b":  # the one catalog alias in the list
        assert out["model_msg"] and "Model" in out["model_msg"], out["model_msg"]


@pytest.mark.parametrize("text", CONFIG_TEXTS, ids=lambda t: repr(t[:40]))
def test_a_hostile_pasted_config_is_refused_quickly_with_a_message(sandbox, text) -> None:
    out = timed(callbacks.estimate_view, {**DEFAULTS, "config_text": text})
    assert_clean(out)
    assert sandbox == []
    if text.strip() and text != "\ufeff{}" and "64.5" not in text:  # blank: the name is used instead
        assert out["model_msg"] and out["verdict"].count("CHECK THE INPUT") == 1, (text[:80],
                                                                                  out["verdict"][:300])
        changed = [k for k in ("num_hidden_layers", "intermediate_size", "hidden_size", "vocab_size",
                               "moe_layer_freq", "num_local_experts")
                   if f'"{k}": ' in text and k not in CANARY_CONFIG or
                   (k in CANARY_CONFIG and f'"{k}": {json.dumps(CANARY_CONFIG[k])}' not in text
                    and f'"{k}"' in text)]
        needle = changed[0] if changed else "config"
        assert needle in out["model_msg"], (text[:80], out["model_msg"][:300])


def test_ten_to_the_ninth_layers_is_refused_naming_the_field() -> None:
    out = callbacks.estimate_view({**DEFAULTS, "config_text": hostile_config(num_hidden_layers=10**9)})
    assert "num_hidden_layers is 1000000000" in out["model_msg"] and "1..1,024" in out["model_msg"]
    nested = json.dumps({"model_type": "x", "text_config": {**CANARY_CONFIG, "num_hidden_layers": 10**9}})
    assert ("text_config.num_hidden_layers"
            in callbacks.estimate_view({**DEFAULTS, "config_text": nested})["model_msg"])


def test_nesting_is_counted_outside_strings_only() -> None:
    # brackets in a string, an escaped quote
    inside = '{"a": "' + "[" * 100 + '\\"' + "{" * 100 + '", "b": 1}'
    assert limits.parse_json(inside)["b"] == 1
    assert limits.parse_json("[" * 32 + "]" * 32)
    with pytest.raises(TuneplanError, match="nests deeper than 32"):
        limits.parse_json("[" * 33 + "]" * 33)


def test_every_catalog_config_is_within_the_pages_limits() -> None:
    from tuneplan.catalog.models import _load_entry_config, catalog_entries

    for e in catalog_entries():
        text = json.dumps(_load_entry_config(e.file))
        limits.check_config(limits.parse_json(text))  # raises on a refused field


@pytest.mark.parametrize("field", NUMBER_FIELDS)
def test_a_bad_number_gets_a_message_naming_its_field(field) -> None:
    method = "qlora" if field in ("bits", "rank") else DEFAULTS["method"]
    for bad in ("abc", float("nan"), float("inf"), 10**400, "9" * 5000, [], -1, 10**13):
        if field == "zero" and bad == 10**13:
            bad = 4
        out = timed(callbacks.estimate_view, {**DEFAULTS, "method": method, field: bad})
        assert_clean(out)
        shown = "".join(out[f"{g}_msg"] for g in form.GROUPS)
        assert LABELS[field] in shown, (field, bad, shown[:300])


def test_a_huge_number_is_refused_before_any_search() -> None:
    msg = callbacks.estimate_view({**DEFAULTS, "gpus": 10**6})["hardware_msg"]
    assert "GPUs per node" in msg and "up to 4,096" in msg
    html = timed(plans.fit_view, dict(DEFAULTS), 10**9)
    assert "global_batch" in html and "up to 1,048,576" in html


def random_form(rng: random.Random) -> dict[str, Any]:
    v = dict(DEFAULTS)
    for _ in range(rng.randint(1, 4)):
        roll = rng.random()
        if roll < 0.25:
            v["model"] = rng.choice(NAMES)
        elif roll < 0.4:
            v["config_text"] = rng.choice(CONFIG_TEXTS)
        elif roll < 0.75:
            v[rng.choice(NUMBER_FIELDS)] = rng.choice(NUMBERS)
        else:
            v[rng.choice(TEXT_FIELDS)] = rng.choice(TEXTS)
    for k in ("fsdp", "compile", "activation_offload", "packing"):
        if rng.random() < 0.1:
            v[k] = rng.choice([True, "yes", 1, None])
    return v


def test_random_hostile_forms_never_escape_the_handlers(sandbox) -> None:
    rng = random.Random(2026)
    t0 = time.perf_counter()
    for i in range(400):
        v = random_form(rng)
        assert_clean(timed(callbacks.estimate_view, v))
        if i % 20 == 0:  # the planner searches cost more: fewer of them
            assert_clean(timed(plans.fit_view, v, rng.choice([16, -1, 10**9, "x", float("nan")])))
            assert_clean(timed(plans.deploy_view, v, rng.choice(["bf16", "../x", None]),
                               rng.choice([4096, 10**12, "nan"]), rng.choice([1, 0, 10**9])))
        if i % 50 == 0:
            assert_clean(timed(plans.gpus_view, v))
        try:
            callbacks.estimate_dict(v)
        except TuneplanError:
            pass  # the JSON API's contract: a TuneplanError naming the field
    assert sandbox == [], sandbox[:10]
    assert time.perf_counter() - t0 < 45


def test_uploads_are_bytes_with_a_cap_never_a_path(sandbox) -> None:
    rng = random.Random(7)
    for data in [bytes(rng.getrandbits(8) for _ in range(4096)), b"\xff" * 10, b"\x00" * 100,
                 b"{" * (limits.PASTE_MAX_BYTES + 1), json.dumps(CANARY_CONFIG).encode()[:-1]]:
        text, msg = callbacks.read_upload(data)
        assert (text == "") == bool(msg)
        if text:
            assert_clean(callbacks.estimate_view({**DEFAULTS, "config_text": text}))
    for path in ("etc/passwd", "/etc/passwd", str(Path.cwd() / "config.json"), Path("config.json")):
        text, msg = callbacks.read_upload(path)  # what a client could name instead of sending a file
        assert text == "" and "did not arrive as a file" in msg
    assert sandbox == []


def test_export_formats_from_a_client_write_only_into_the_pages_own_folder(sandbox) -> None:
    for formats in (["../../x"], ["/etc/passwd"], [None], [5], ["hf-script"] * 3, []):
        paths, msg = plans.export_files(dict(DEFAULTS), formats)
        assert_clean(msg)
        root = exports.export_root()
        assert all(Path(p).resolve().is_relative_to(root.resolve()) for p in paths)
    assert sandbox == []


def test_a_hub_id_is_fetched_anonymously_into_a_folder_of_its_own(monkeypatch, tmp_path) -> None:
    """Online: no token, not the server's cache, the file's size checked first; offline: a message."""
    import huggingface_hub

    calls: list[dict[str, Any]] = []

    class Meta:
        size = 300

    def metadata(url: str, **kw: Any) -> Meta:
        calls.append({"what": "metadata", "url": url, **kw})
        return Meta()

    def download(repo_id: str, filename: str, **kw: Any) -> str:
        calls.append({"what": "download", "repo_id": repo_id, **kw})
        p = Path(kw["cache_dir"]) / "config.json"
        p.write_text(json.dumps({**CANARY_CONFIG, "_name_or_path": repo_id}))
        return str(p)

    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "operator-cache"))
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", metadata)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    monkeypatch.setattr("tuneplan.catalog.models._hub_reachable", lambda *a, **k: True)
    spec, _ = sources.resolve_name("someone/public-model")
    assert spec.name == "someone/public-model" and spec.n_layers == 2
    meta, dl = calls
    assert meta["token"] is False and dl["token"] is False
    private = Path(dl["cache_dir"])
    assert not private.exists(), "the fetch's own folder is removed after it"
    assert not str(private).startswith(str(tmp_path / "operator-cache"))
    Meta.size = limits.PASTE_MAX_BYTES + 1
    with pytest.raises(TuneplanError, match="bytes"):
        sources.resolve_name("someone/huge-config")
    monkeypatch.setattr("tuneplan.catalog.models._hub_reachable", lambda *a, **k: False)
    with pytest.raises(TuneplanError, match="cannot be reached"):
        sources.resolve_name("someone/other-model")


def test_the_export_folder_is_the_pages_own_and_cleaning_spares_everything_else(tmp_path,
                                                                                 monkeypatch) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(exports, "_root", None)
    monkeypatch.setattr(exports, "_made", {})
    monkeypatch.setattr(exports, "_sessions", {})
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    (tmp_path / "tuneplan-web-export").symlink_to(victim)  # planted where the page used to write
    other = tmp_path / "someone-elses-folder"
    other.mkdir()
    old = time.time() - 10 * 86400
    os.utime(other, (old, old))
    paths, msg = plans.export_files(dict(DEFAULTS), ["hf-script"])
    assert paths, msg
    root = exports.export_root()
    assert (root.parent == tmp_path and root.name.startswith("tuneplan-web-")
            and oct(root.stat().st_mode)[-3:] == "700")
    assert all(Path(p).parent.parent == root for p in paths)
    folder = Path(paths[0]).parent
    assert exports.sweep() == []  # fresh: kept
    assert exports.sweep(now=time.monotonic() + exports.KEEP_S + 1) == [folder] and not folder.exists()
    assert (victim / "keep.txt").read_text() == "mine" and other.exists() and root.exists()
    assert sorted(os.listdir(victim)) == ["keep.txt"]


def test_each_session_has_its_own_folder_removed_when_it_ends(tmp_path, monkeypatch) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(exports, "_root", None)
    monkeypatch.setattr(exports, "_made", {})
    monkeypatch.setattr(exports, "_sessions", {})
    a1, a2 = exports.fresh_folder("tab-a"), exports.fresh_folder("tab-a")
    hostile = exports.fresh_folder("../../victim")  # a client's session id is a key, never a path
    assert (a1 != a2 and a1.parent == a2.parent != exports.export_root()
            and a1.parent.parent == exports.export_root())
    assert hostile.parent.parent == exports.export_root() and not (tmp_path / "victim").exists()
    (a1 / "train.py").write_text("x")
    assert exports.end_session("tab-a") == a1.parent
    assert not a1.exists() and not a2.exists() and hostile.exists()
    assert exports.end_session("never-seen") is None and exports.end_session(None) is None
    assert set(exports.made()) == {hostile, hostile.parent}


def test_serving_beyond_loopback_warns_what_it_exposes(monkeypatch) -> None:
    pytest.importorskip("gradio")
    from typer.testing import CliRunner

    import tuneplan.web
    from tuneplan.cli.app import app
    from tuneplan.cli.serve_cmd import is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert is_loopback("127.1.2.3") and not is_loopback("0.0.0.0") and not is_loopback("example.org")
    launched: list[tuple[Any, ...]] = []
    closed: list[bool] = []

    class Server:
        def close(self) -> None:
            closed.append(True)

    def launch(*a: Any, **k: Any) -> Server:
        launched.append(a)
        return Server()

    monkeypatch.setattr(tuneplan.web, "launch", launch)
    # the command waits for Ctrl-C; here the wait ends at once and the server must still be closed
    monkeypatch.setattr("tuneplan.cli.serve_cmd.wait_for_interrupt", lambda: None)
    monkeypatch.setattr("tuneplan.cli.serve_cmd._check_free", lambda host, port: None)
    for host, warned in (("0.0.0.0", True), ("127.0.0.1", False)):
        r = CliRunner().invoke(app, ["serve", "--host", host, "--port", "7861"])
        assert r.exit_code == 0, r.output
        assert ("warning: --host 0.0.0.0 exposes the page" in r.stderr) is warned
        if warned:
            assert "anonymously" in r.stderr and "opens no file a visitor names" in r.stderr
    assert launched == [("0.0.0.0", 7861), ("127.0.0.1", 7861)] and closed == [True, True]
