"""Web page speed: server-side time per update, and a bounded load test of the estimate endpoint.

    python benchmarks/web_load.py                 # 200 requests, 20 concurrent clients
    python benchmarks/web_load.py --requests 400 --clients 40 --json out.json
    python benchmarks/web_load.py --new-sessions --requests 2000   # memory per session

Part 1 times the page's callbacks in process (what the server spends per field change): the verdict
update (``estimate_view``) over a grid of models, methods, cards and sequence lengths, and the two
planner tabs, which run only while their tab is open.

Part 2 starts ``tuneplan serve`` on 127.0.0.1 (loopback only; a free port; its own process) and sends
``--requests`` calls of the page's own ``estimate`` endpoint (Gradio's HTTP API: POST the form, read the
result stream) from ``--clients`` threads at once, each form different. It counts errors (HTTP status, an
``error`` event, or an answer without a verdict) and reports latency percentiles and throughput. Bounded:
each request times out after 30 s and the whole run stops after ``--deadline`` seconds. Exit status 1 if
any request failed or the deadline passed. Needs the ``web`` extra.

``--new-sessions`` sends every request from a session of its own (a crowd of one-off visitors) and reads
the server's resident memory (Linux ``/proc``) after a warm-up and at the end: what sessions cost it.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

MODELS = ("Qwen/Qwen2.5-0.5B", "Qwen/Qwen2.5-7B-Instruct", "meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-32B",
          "meta-llama/Llama-3.3-70B-Instruct", "mistralai/Mixtral-8x7B-v0.1")
METHODS = ("full", "lora", "qlora")
CARDS = ("rtx-4090", "a100-80gb-sxm4", "t4", "")
SEQS = (512, 2048, 8192)


def forms() -> list[dict[str, Any]]:
    from tuneplan.web.form import DEFAULTS

    return [{**DEFAULTS, "model": m, "method": me, "gpu": g, "seq": s}
            for m in MODELS for me in METHODS for g in CARDS for s in SEQS]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def summary(ms: list[float]) -> dict[str, float]:
    return {"n": len(ms), "p50_ms": round(pct(ms, 0.5), 2), "p95_ms": round(pct(ms, 0.95), 2),
            "max_ms": round(max(ms), 2), "mean_ms": round(statistics.fmean(ms), 2)}


def time_callbacks() -> dict[str, Any]:
    from tuneplan.web import callbacks, plans

    fs = forms()
    callbacks.estimate_view(fs[0])  # warm the catalog caches, as a running server has
    out: dict[str, Any] = {}
    ms = []
    for f in fs:
        t = time.perf_counter()
        callbacks.estimate_view(f)
        ms.append((time.perf_counter() - t) * 1e3)
    out["estimate_view"] = summary(ms)
    for name, fn in (("fit_view", plans.fit_view), ("gpus_view", plans.gpus_view)):
        ms = []
        for f in fs[:: max(1, len(fs) // 24)]:  # 24 forms spread over the grid: the searches are slower
            if name == "fit_view" and not f["gpu"]:
                continue
            t = time.perf_counter()
            fn(f)
            ms.append((time.perf_counter() - t) * 1e3)
        out[name] = summary(ms)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, timeout_s: float = 120) -> subprocess.Popen:
    """`tuneplan serve` on 127.0.0.1 in its own process (clients here do not share its interpreter)."""
    import tempfile

    import httpx

    log = tempfile.TemporaryFile("w+")  # not a pipe: a chatty server must never block on it
    proc = subprocess.Popen([sys.executable, "-m", "tuneplan.cli.app", "serve", "--host", "127.0.0.1",
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"the server exited: {log.read()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/", timeout=5).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"the server did not answer within {timeout_s} s")


def rss_mib(pid: int) -> float:
    """Resident memory of a process (Linux /proc), in MiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kib / 1024


def load_test(n_requests: int, n_clients: int, deadline_s: float, *,
              new_sessions: bool = False) -> dict[str, Any]:
    """``new_sessions``: every request opens a session of its own (a crowd of one-off visitors), and the
    server's resident memory is read before and after, to see what each session costs it."""
    import httpx

    from tuneplan.web.form import FIELDS

    port = free_port()
    proc = start_server(port)
    base = f"http://127.0.0.1:{port}"
    try:
        prefix = "/gradio_api" if httpx.get(f"{base}/gradio_api/info", timeout=30).status_code == 200 else ""
        fs = forms()
        with httpx.Client(base_url=base, timeout=30) as c:  # warm up (imports, caches) in one session
            for f in fs[:20]:
                r = c.post(f"{prefix}/call/estimate",
                           json={"data": [f[k] for k in FIELDS], "session_hash": "warm"})
                c.get(f"{prefix}/call/estimate/{r.json()['event_id']}")
        rss_before = rss_mib(proc.pid)
        stop_at = time.monotonic() + deadline_s
        lat: list[float] = []
        errors: list[str] = []
        lock = threading.Lock()

        def client(k: int) -> None:
            session = f"web-load-{k}-{os.getpid()}"  # one session per client, as one browser tab holds
            with httpx.Client(base_url=base, timeout=30) as c:
                for j in range(k, n_requests, n_clients):
                    if time.monotonic() > stop_at:
                        with lock:
                            errors.append("deadline")
                        return
                    data = [fs[j % len(fs)][f] for f in FIELDS]
                    if new_sessions:
                        session = f"web-load-{j}-{os.getpid()}"
                    t = time.perf_counter()
                    try:
                        r = c.post(f"{prefix}/call/estimate", json={"data": data, "session_hash": session})
                        r.raise_for_status()
                        s = c.get(f"{prefix}/call/estimate/{r.json()['event_id']}")
                        s.raise_for_status()
                        ok = "event: complete" in s.text and "data-verdict" in s.text
                        err = None if ok else s.text[:200]
                    except httpx.HTTPError as exc:
                        err = f"{type(exc).__name__}: {exc}"
                    with lock:
                        if err:
                            errors.append(err)
                        else:
                            lat.append((time.perf_counter() - t) * 1e3)

        t0 = time.perf_counter()
        with ThreadPoolExecutor(n_clients) as pool:
            list(pool.map(client, range(n_clients)))
        wall = time.perf_counter() - t0
        rss_after = rss_mib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    res: dict[str, Any] = {"requests": n_requests, "clients": n_clients, "ok": len(lat),
                           "errors": len(errors), "wall_s": round(wall, 2),
                           "throughput_rps": round(len(lat) / wall, 1),
                           "new_sessions": new_sessions, "rss_before_mib": round(rss_before, 1),
                           "rss_after_mib": round(rss_after, 1)}
    if lat:
        res.update(summary(lat))
    if errors:
        res["first_errors"] = errors[:3]
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--deadline", type=float, default=120.0,
                    help="stop the load test after this many seconds")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--new-sessions", action="store_true",
                    help="a new session per request (memory per session); skips the in-process timings")
    a = ap.parse_args()
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    try:
        import gradio  # noqa: F401
        import httpx  # noqa: F401
    except ImportError as exc:
        print(f"needs the web extra (pip install -e '.[web]'): {exc}", file=sys.stderr)
        return 2
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start "
          "(other processes share the CPUs: figures are upper bounds when it is high)")
    cb = {} if a.new_sessions else time_callbacks()
    if cb:
        print("server-side time per update (in process, ms):")
    for k, v in cb.items():
        print(f"  {k:14s} n={v['n']:4d}  p50 {v['p50_ms']:7.2f}  p95 {v['p95_ms']:7.2f}  "
              f"max {v['max_ms']:7.2f}")
    lt = load_test(a.requests, a.clients, a.deadline, new_sessions=a.new_sessions)
    each = "a new session each" if a.new_sessions else "one session per client"
    print(f"loopback load test: {lt['requests']} requests ({each}) from {lt['clients']} concurrent clients "
          "to /estimate")
    print(f"  ok {lt['ok']}  errors {lt['errors']}  wall {lt['wall_s']} s  "
          f"throughput {lt['throughput_rps']} req/s")
    if lt["ok"]:
        print(f"  latency (ms): p50 {lt['p50_ms']}  p95 {lt['p95_ms']}  max {lt['max_ms']}  "
              f"mean {lt['mean_ms']}")
    print(f"  server resident memory: {lt['rss_before_mib']} MiB before, {lt['rss_after_mib']} MiB after")
    for e in lt.get("first_errors", []):
        print(f"  error: {e}")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump({"callbacks": cb, "load": lt, "cpus": os.cpu_count()}, f, indent=2)
    return 0 if lt["errors"] == 0 and lt["ok"] == a.requests else 1


if __name__ == "__main__":
    sys.exit(main())
