"""`tuneplan doctor` (this machine: what runs, what breaks, the fix); `tuneplan accelerators` (the
catalog)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from tuneplan.cli.render import console, gib, print_findings, print_json
from tuneplan.cli.wording import cli_texts

STATUS_STYLE = {
    "works": "green",
    "works, with warnings": "yellow",
    "breaks": "red bold",
    "not installed": "dim",
}


def _yn(v: bool | None) -> str:
    return {True: "[green]yes[/]", False: "[red]no[/]", None: "[dim]?[/]"}[v]


def render_doctor(d: dict[str, Any]) -> None:
    m = d["machine"]
    p = m.get("platform", {})
    drv = (
        f"driver {m['driver_version']} (CUDA {m['cuda_driver_version']})"
        if m.get("driver_version")
        else "no NVIDIA driver"
    )
    where = f"Python {p['python']} · {p.get('os', '')} {p.get('machine', '')} · " if p.get("python") else ""
    console.print(f"[bold]tuneplan doctor[/]  {where}{drv}")
    v = m.get("versions", {})
    libs = Table(title="Libraries", show_header=True)
    libs.add_column("library")
    libs.add_column("version")
    for k in (
        "torch",
        "bitsandbytes",
        "peft",
        "transformers",
        "accelerate",
        "deepspeed",
        "flash_attn",
        "flash_attn_3",
        "torch_npu",
    ):
        val = v.get(k)
        extra = ""
        if k == "torch" and val:
            build = (
                f"CUDA {v['torch_cuda']}"
                if v.get("torch_cuda")
                else f"ROCm {v['torch_hip']}"
                if v.get("torch_hip")
                else "CPU build"
            )
            archs = " ".join(v.get("torch_arch_list") or [])
            extra = f"  [dim]{build}{'; ' + archs if archs else ''}[/]"
        if k == "bitsandbytes" and v.get("bitsandbytes_import_error"):
            extra = f"  [red]import: {escape(v['bitsandbytes_import_error'])}[/]"
        libs.add_row(k, (escape(val) if val else "[dim]not installed[/]") + extra)
    console.print(libs)
    for n in m.get("notes", []):
        console.print(f"[dim]detect: {escape(n)}[/]", highlight=False)
    for dev in d["devices"]:
        a, det = dev["accelerator"], dev["detected"]
        idx = ",".join(map(str, dev["indices"]))
        free = (
            f", {gib(det['memory_free_bytes'])} GiB free" if det.get("memory_free_bytes") is not None else ""
        )
        arch = f"CC {a['compute_capability']}" if a["compute_capability"] else (a["arch_target"] or "?")
        console.print(
            f"\n[bold]{det['kind'].upper()} {idx}[/] ({dev['count']}x) {det['name']} -> {a['matched']}: "
            f"{gib(a['memory_bytes'])} GiB{free}, {arch}"
        )
        console.print("  " + "  ".join(f"{c['name']} {_yn(c['ok'])}" for c in dev["capabilities"]))
        console.print("[bold]What will run here[/]")
        for task in dev["tasks"]:
            st = STATUS_STYLE.get(task["status"], "white")
            console.print(
                f"{escape(task['label'])}: [{st}]{task['status']}[/]"
                + (f"  {escape(task['detail'])}" if task["detail"] else ""),
                highlight=False,
            )
            if task["fix"]:
                console.print(f"  [dim]fix: {escape(task['fix'])}[/]", highlight=False)
        print_findings(dev["findings"])
    print_findings(d["findings"])
    colour = "red" if d["exit_code"] else "green"
    console.print(f"[{colour} bold]{escape(d['verdict'])}[/]")


def register(app: typer.Typer) -> None:
    @app.command("doctor")
    def doctor_cmd(
        as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
        machine: Annotated[
            str | None,
            typer.Option(
                "--machine",
                help="diagnose a machine described in a file (JSON/YAML; e.g. another box's `doctor --json`)",
            ),
        ] = None,
        no_import_check: Annotated[
            bool,
            typer.Option("--no-import-check", help="skip the `import bitsandbytes` trial in a child process"),
        ] = False,
    ) -> None:
        """This machine: GPUs/NPUs, driver, library versions, and what will run or break, with the fix.

        Exit status: 0 (also when no GPU is found), 1 when plain LoRA cannot run as installed, 2 bad input.
        """
        from tuneplan.doctor import StaticDetector, SystemDetector, diagnose

        source = (
            StaticDetector.from_file(machine) if machine
            else SystemDetector(check_bnb_import=not no_import_check)
        )
        report = diagnose(source.detect())
        d = cli_texts(report.to_dict())
        if as_json:
            print_json(d)
        else:
            render_doctor(d)
        if report.exit_code:
            raise typer.Exit(report.exit_code)

    @app.command("accelerators")
    def accelerators_cmd(
        search: Annotated[
            str | None, typer.Argument(help="filter by substring of id, name or vendor")
        ] = None,
        as_json: Annotated[
            bool, typer.Option("--json", help="print the full records (with sources) as JSON")
        ] = False,
        details: Annotated[
            bool,
            typer.Option(
                "--details", help="add the price reading's date and how verified each row is (wide)"
            ),
        ] = False,
        hardware_file: Annotated[
            str | None,
            typer.Option("--hardware-file", help="TOML/YAML file adding or overriding accelerators"),
        ] = None,
    ) -> None:
        """The accelerator catalog: memory as software sees it, bandwidth, bf16 TFLOPS, CC, price, sources."""
        from tuneplan.catalog.accelerators import accelerators

        cat = accelerators(hardware_file)
        q = (search or "").lower()
        rows = [a for a in cat.values() if not q or q in f"{a.id} {a.name} {a.vendor}".lower()]
        if as_json:
            print_json({"accelerators": [a.to_dict() for a in rows]})
            return
        console.print(f"[bold]Accelerators[/] ({len(rows)})", highlight=False)
        t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
        columns = [
            ("id", "left"),
            ("GiB", "right"),
            ("GB/s", "right"),
            ("bf16 TF", "right"),
            ("arch", "left"),
            ("bf16", "left"),
            ("fp8", "left"),
            ("link", "left"),
            ("$/h", "right"),
        ]
        if details:
            columns += [("price read", "left"), ("verified", "left")]
        for c, j in columns:
            t.add_column(c, justify="right" if j == "right" else "left", no_wrap=c != "id", overflow="fold",
                         min_width=18 if c == "id" else None)
        for a in rows:
            mem = gib(a.memory_bytes) + ("" if a.memory_is_observed else "*")
            link = {True: "fast", False: "PCIe", None: "?"}[a.has_fast_link]
            cells = [
                a.id,
                mem,
                _num(a.memory_bandwidth_gbs),
                _num(a.bf16_tflops_dense),
                a.cc_str or (a.arch_target or "?").replace("ascend", ""),
                _yn(a.supports_bf16),
                _yn(a.supports_fp8),
                link,
                _num(a.cloud_usd_per_gpu_hr),
            ]
            if details:
                cells += [
                    a.cloud_price_date or "-",
                    a.verified + ("" if a.origin == "catalog" else " (user)"),
                ]
            t.add_row(*cells)
        console.print(t)
        console.print(
            "[dim]GiB: memory as torch / nvidia-smi / npu-smi report it (* derived: marketed x 0.99); "
            "'-' is unknown, not zero; link fast = NVLink/Infinity Fabric/HCCS. "
            "--json has names, sources and "
            "unverified fields; --details the price date and verification.[/]"
        )


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:g}"
