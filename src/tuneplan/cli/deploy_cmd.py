"""`tuneplan deploy`: after the fine-tune, merge, store and serve it: memory per GPU, cards, decode speed."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from tuneplan.cli.options import with_setup_options
from tuneplan.cli.render import console, gib, print_json

_D = "Deploy"  # help panel


def _size(n: int) -> str:
    """GiB, or MiB below one GiB (adapters are megabytes)."""
    return f"{n / 1024**3:,.2f} GiB" if n >= 1024**3 else f"{n / 1024**2:,.1f} MiB"


def _o(*names: str, help: str) -> Any:
    return typer.Option(*names, help=help, rich_help_panel=_D)


def register(app: typer.Typer) -> None:
    @app.command("deploy")
    @with_setup_options
    def deploy_cmd(
        model: Annotated[str, typer.Argument(help="catalog name, HF id, or path to config.json")],
        serve_precision: Annotated[str, _o("--serve-precision", help="bf16 | fp16 | int8 | int4")] = "bf16",
        quant_method: Annotated[
            str | None,
            _o(
                "--quant-method",
                help="int4: gptq | awq | bnb | gguf-q4_k_m | gguf-q4_0; int8: bnb | gptq | gguf-q8_0",
            ),
        ] = None,
        context: Annotated[int, _o("--context", help="tokens per sequence (prompt + output)")] = 4096,
        concurrency: Annotated[int, _o("--concurrency", help="sequences served at once")] = 1,
        gpu: Annotated[str | None, _o("--gpu", "-g", help="accelerator to serve on, e.g. rtx4090")] = None,
        tp: Annotated[int, _o("--tp", help="tensor-parallel GPUs")] = 1,
        kv_dtype: Annotated[str | None, _o("--kv-dtype", help="bf16 | fp16 | fp8 [serving dtype]")] = None,
        keep_adapter: Annotated[
            bool, _o("--keep-adapter/--merge", help="serve the LoRA adapter unmerged [merge]")
        ] = False,
        mla_cache: Annotated[
            str, _o("--mla-cache", help="latent (vLLM/SGLang) | expanded (transformers)")
        ] = "latent",
        prefill_tokens: Annotated[
            int, _o("--prefill-tokens", help="engine's tokens per step (vLLM max_num_batched_tokens)")
        ] = 2048,
        gpu_util: Annotated[
            float, _o("--gpu-util", help="share of the card the engine may use (vLLM default 0.9)")
        ] = 0.9,
        qlora_merge: Annotated[
            str, _o("--qlora-merge", help="dequantize | reload: how a QLoRA adapter is merged")
        ] = "dequantize",
        cards: Annotated[int, _o("--cards", help="how many catalog cards to list")] = 8,
        as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
        setup_kw: dict[str, Any] | None = None,
    ) -> None:
        """Serve the fine-tuned model: weights at the serving precision, adapter, KV cache, activations.

        Also the merge step (memory and disk), which catalog cards can serve it at what context and
        concurrency, and an upper bound on decode tokens/s. Training flags (--method, --rank, ...) say what
        was trained. Exit status: 0 fits (or no --gpu), 1 does not fit on --gpu, 2 bad input.
        """
        from tuneplan.deploy import plan_deploy

        d = plan_deploy(
            model,
            serve_precision=serve_precision,
            quant_method=quant_method,
            context=context,
            concurrency=concurrency,
            gpu=gpu,
            tp=tp,
            kv_dtype=kv_dtype,
            keep_adapter=keep_adapter,
            mla_cache=mla_cache,
            prefill_tokens=prefill_tokens,
            gpu_util=gpu_util,
            qlora_merge=qlora_merge,
            **(setup_kw or {}),
        )
        if as_json:
            print_json(d)
        else:
            _render(d, cards)
        if "gpu" in d and not d["gpu"]["fits"]:
            raise typer.Exit(1)


def _render(d: dict[str, Any], n_cards: int) -> None:
    from rich.table import Table

    m, tr, sv, pg = d["model"], d["training"], d["serving"], d["per_gpu"]
    trained = (
        tr["method"]
        + (f" {tr['bits']}-bit" if tr["bits"] else "")
        + (f" r={tr['rank']}" if tr["rank"] else "")
    )
    console.print(
        f"[bold]{m['name']}[/]  {m['params_total'] / 1e9:.2f}B params  ·  trained: {trained}  ·  serve "
        f"{sv['format']}, adapter {sv['adapter']}  ·  context {sv['context']:,} x {sv['concurrency']} "
        f"sequences" + (f"  ·  TP {sv['tp']}" if sv["tp"] > 1 else "")
    )
    t = Table(title="Serving memory per GPU (GiB)")
    t.add_column("part")
    t.add_column("GiB", justify="right")
    t.add_column("what it is", style="dim")
    kv = d["kv_cache"]
    w = d["weights"]
    rows = [
        ("weights", pg["weights"], f"{w['bits_per_param']:.2f} bits/param; {w['unquantized']}"),
        ("adapter", pg["adapter"], "unmerged LoRA, 16-bit"),
        (
            "KV cache",
            pg["kv_cache"],
            f"{kv['kind']}, {kv['bytes_per_token'] / 1024:,.1f} KiB/token ({kv['dtype']})"
            + (f"; {kv['window_layers']} layers windowed at {kv['window']}" if kv["window_layers"] else ""),
        ),
        (
            "activations",
            pg["activations"],
            f"{sv['prefill_tokens']} tokens per step + sampler (a floor; up to "
            f"{gib(d['bands']['activations'][1])} GiB)",
        ),
        ("workspace", pg["workspace"], "CUDA context, cuBLAS, CUDA graphs"),
    ]
    for name, v, why in rows:
        if v or name != "adapter":
            t.add_row(name, gib(v), why)
    t.add_row("[bold]total[/]", f"[bold]{gib(pg['total'])}[/]", "")
    console.print(t)
    if w["gguf_types"]:
        console.print(
            "[dim]GGUF tensor types: "
            + ", ".join(f"{k} x{v}" for k, v in sorted(w["gguf_types"].items()))
            + "[/]"
        )
    mg, dk = d["merge"], d["disk"]
    if mg["needed"]:
        console.print(
            f"merge: {mg['path']}; needs [bold]{_size(mg['peak_bytes'])}[/] (GPU or CPU RAM): 16-bit base "
            f"{_size(mg['base_16bit_bytes'])} + adapter {_size(mg['adapter_bytes'])} + temporaries "
            f"{_size(mg['temp_bytes'] + mg['quantized_base_bytes'])}"
        )
        if "gpu" in d:
            console.print(
                f"  the merge {'fits' if d['gpu']['merge_fits'] else 'does not fit'} on {d['gpu']['name']}"
                + ("" if d["gpu"]["merge_fits"] else ": run it on the CPU with that much RAM")
            )
    else:
        console.print(f"merge: {mg['path']}")
    console.print(
        f"disk: training leaves {_size(dk['training_checkpoint_bytes'])} ({dk['training_checkpoint']}); "
        f"merged 16-bit {_size(dk['merged_16bit_bytes'])}; served format "
        f"{_size(dk['served_format_bytes'])}"
    )
    if "gpu" in d:
        g = d["gpu"]
        if not g["runs"]:
            console.print(f"[red bold]CANNOT RUN[/] on {g['name']}: {g['runs_note']}")
        elif g["runs_note"]:
            console.print(f"[dim]{g['runs_note']}[/]")
        verdict = "[green bold]SERVES[/]" if g["memory_fits"] else "[red bold]DOES NOT FIT[/]"
        console.print(
            f"{verdict} in the memory of {g['name']} "
            f"(budget {gib(g['budget_bytes'])} GiB = {sv['gpu_util']:.0%} of "
            f"{gib(g['memory_bytes'])}): headroom {gib(g['headroom_bytes'])} GiB; up to "
            f"{g['max_concurrency_at_context']:,} sequences at {sv['context']:,} tokens, or one sequence of "
            f"{g['max_context_one_sequence']:,} tokens"
        )
        dec = d.get("decode") or {}
        one, at = dec.get("single"), dec.get("at_concurrency")
        if one and at:
            cross = dec["compute_bound_from_batch"]
            many = (
                (
                    f"at {at['batch']} sequences {at['tokens_per_s_per_sequence']:,.0f} each, "
                    f"{at['tokens_per_s_total']:,.0f} total; "
                )
                if at["batch"] > 1
                else ""
            )
            if cross is None:
                takeover = (
                    "compute never takes over at this context (each sequence's KV reads outweigh its FLOPs)"
                )
            else:
                takeover = f"compute takes over from batch {cross:,}" + (
                    "" if dec["crossover_fits_memory"] else " (more sequences than fit)"
                )
            console.print(
                f"decode (upper bound): {one['tokens_per_s_per_sequence']:,.0f} tokens/s for one sequence "
                f"({one['bound_by']}-bound); {many}{takeover}"
            )
            if dec["adapter_flops_share"]:
                console.print(
                    f"[yellow]unmerged adapter: +{dec['adapter_flops_share']:.1%} FLOPs per token and its "
                    "kernels on every targeted layer; merge it to serve at the base model's speed[/]"
                )
        else:
            console.print(
                "[dim]decode bound: this card lacks bandwidth or throughput figures in the catalog[/]"
            )
    cards = d.get("cards", [])
    if cards and n_cards > 0:
        ok = [c for c in cards if c["fits"]]
        t = Table(title=f"Cards that serve it ({len(ok)} of {len(cards)} in the catalog; smallest first)")
        for col in (
            "card",
            "GiB",
            f"max sequences at {d['serving']['context']:,}",
            f"max context, 1 seq (model: {d['context_limit']:,})",
            "GB/s",
        ):
            t.add_column(col, justify="left" if col == "card" else "right")
        for c in ok[:n_cards]:
            t.add_row(
                c["name"],
                gib(c["memory_bytes"]),
                f"{c['max_concurrency_at_context']:,}",
                f"{c['max_context_one_sequence']:,}",
                f"{c['memory_bandwidth_gbs'] or '-'}",
            )
        console.print(t)
    for a in d.get("assumptions", []):
        console.print(f"[dim]assumes: {a}[/]")
