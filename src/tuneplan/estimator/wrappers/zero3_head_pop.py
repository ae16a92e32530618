"""What ZeRO-3 holds gathered in a LoRA, QLoRA or freeze run's forward once its prefetcher pops the output
head (untied, or a freeze run's tied head, the embedding's weight released after its forward): the layers it
ran ahead to, not yet run, beside the head, read from DeepSpeed 0.19.8's ``PartitionedParameterCoordinator``
(partitioned_param_coordinator.py) with a complete trace."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from tuneplan.estimator.bnb_scope import quantized
from tuneplan.estimator.compute import has_rotary
from tuneplan.estimator.dequant_time import dequant_library
from tuneplan.estimator.lora_bottom_layer import bottom_gradient_free
from tuneplan.estimator.weights import NF4_BLOCK
from tuneplan.estimator.wrappers.fully_shard import embedding_output_requires_grad
from tuneplan.estimator.wrappers.zero3_coordinator import (
    DS_MAX_LIVE_PARAMETERS,
    DS_MAX_REUSE_DISTANCE,
    DS_PARAM_PERSISTENCE_THRESHOLD,
    PEFT_MODULES_PER_TARGET,
    embedding_used_last,
)
from tuneplan.estimator.wrappers.zero3_first_pass import embedding_released_after_forward
from tuneplan.estimator.wrappers.zero3_lora_top_backward import zero3_lora_forward_bytes
from tuneplan.estimator.wrappers.zero3_module_trace import replayable, replayed_step
from tuneplan.specs.model import Linear, ModelSpec
from tuneplan.specs.setup import TrainSetup

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run

# the wrappers above the token embedding that run ZeRO-3's fetch hook under PEFT: PeftModel, LoraModel,
# the causal-LM model and its base model (peft/peft_model.py, peft/tuners/lora/model.py)
PEFT_WRAPPERS = 4


class ForwardWalk(NamedTuple):
    """The forward's trace of weights (elements) and its coordinator events (:func:`forward_walk`)."""

    trace: list[int]
    nbytes: list[int]  # each entry's bytes gathered: a packed 4-bit weight one a trace element
    layer: list[int]  # the decoder layer of each trace entry (-1: the embedding, n: the head)
    dequant: list[int]  # bytes a 4-bit entry's forward dequantizes beside it (:func:`dequantized_bytes`)
    in_mlp: list[bool]  # an entry of a layer's MLP block, run after its layer's attention block
    events: list[tuple[str, int]]


def forward_walk(model: ModelSpec, setup: TrainSetup, targets: frozenset[str], compute: int = 2,
                 model_code: str = "hf") -> ForwardWalk:
    """The forward's weights in trace order (zero3_coordinator.forward_trace's, LoRA's partitioned matrices
    among them) and its coordinator events in order: ``("fetch", -1)`` for every module whose pre-forward
    hook fetches (each a prefetch opportunity), ``("use", i)`` when weight ``i``'s module has fetched it,
    ``("release", i)`` when ``__params_to_release`` frees it after its forward.

    A LoRA-wrapped linear fetches as itself (with ``lora_A``, an external parameter of it:
    zero3_coordinator.forward_trace), its ``base_layer``, then (after the base layer's release) its dropout,
    ``lora_A`` and ``lora_B`` (peft/tuners/lora/layer.py ``Linear.forward``); a decoder layer fetches as
    itself, its input norm and its attention, then its post-attention norm and MLP container. Released after
    their forward: the embedding (its next use, if any, lies past ``stage3_max_reuse_distance``:
    zero3_first_pass.embedding_released_after_forward outside LoRA), every linear of the layers below the
    top ones :func:`zero3_layers_kept` keeps, the bottom layer's linears with no backward use, and a freeze
    run's frozen layers when its backward stops at the lowest trained one; the adapters' matrices,
    thousands of times smaller, are left gathered. Under QLoRA a 4-bit ``Params4bit`` is partitioned as its
    packed ``uint8`` codes (``ds_numel`` the packed count, one byte each: zero3_quantized.gathered_entries);
    the rest in the ``compute`` dtype. A freeze run has the causal-LM model and its base model above the
    embedding (two wrappers, not PEFT's four)."""
    peft = setup.method in ("lora", "qlora")
    walk = ForwardWalk([model.embed_params], [model.embed_params * compute], [-1], [0], [False],
                       [("fetch", -1)] * ((PEFT_WRAPPERS if peft else 2) + 1) + [("use", 0)])
    embed_kept = (embedding_used_last(model, setup) and 2 * model.params_total < DS_MAX_REUSE_DISTANCE
                  if peft else not embedding_released_after_forward(model, setup))
    walk.events.extend([] if embed_kept else [("release", 0)])
    walk.events.extend([("fetch", -1)] if has_rotary(model) else [])
    bits = setup.quant_bits
    # torchao's NF4 (torchtune) rebuilds its weights with other ops, LLM.int8 with no whole-weight copy
    bnb_4bit = bits == 4 and dequant_library(setup, model_code) == "bitsandbytes"

    def numel(m: Linear) -> tuple[int, int]:
        if bits is not None and quantized(m, model_code):
            packed = m.d_in * m.d_out * bits // 8
            return packed, packed
        return m.params // m.count, m.params // m.count * compute

    per_layer = max(sum(numel(m)[0] * m.count for m in spec.linears) for spec, _ in model.layer_groups)
    kept_from = first_kept_layer(model, setup, per_layer)
    free = bottom_gradient_free(model, targets) if not setup.gradient_checkpointing else frozenset()

    def add(n: int, layer: int, nbytes: int = 0, dequant: int = 0, in_mlp: bool = False) -> bool:
        if n <= DS_PARAM_PERSISTENCE_THRESHOLD:  # persistent: always gathered, never in a round
            return False
        walk.trace.append(n)
        walk.nbytes.append(nbytes or n * compute)
        walk.layer.append(layer)
        walk.dequant.append(dequant)
        walk.in_mlp.append(in_mlp)
        walk.events.append(("use", len(walk.trace) - 1))
        return True

    layer = 0
    for spec, count in model.layer_groups:
        for _ in range(count):
            walk.events.extend([("fetch", -1)] * 3)
            role = spec.linears[0].role
            for m in spec.linears:
                walk.events.extend([("fetch", -1)] * (2 if m.role != role else 0))
                role = m.role
                peft = m.name in targets
                lora = peft and m.count == 1
                for _ in range(m.count):
                    walk.events.append(("fetch", -1))
                    add(setup.rank * m.d_in if lora else 0, layer)
                    walk.events.extend([("fetch", -1)] if peft else [])
                    released = layer < kept_from or (layer == 0 and m.name in free)
                    dequant = (dequantized_bytes(m, setup.double_quant, compute)
                               if bnb_4bit and quantized(m, model_code) else 0)
                    if add(*numel(m)[:1], layer, numel(m)[1], dequant, m.role != "attn") and released:
                        walk.events.append(("release", len(walk.trace) - 1))
                    walk.events.extend([("fetch", -1)] * (PEFT_MODULES_PER_TARGET - 1 if peft else 0))
                    add(m.d_out * setup.rank if lora else 0, layer)
            layer += 1
    # the final norm's fetch, then the head's own: a tied one's weight is the embedding's, a trace entry
    # of its own once released after the embedding's forward
    walk.events.extend([("fetch", -1), ("fetch", -1)])
    add(model.lm_head_params or (0 if embed_kept or peft else model.embed_params), layer)
    return walk


def first_kept_layer(model: ModelSpec, setup: TrainSetup, per_layer: int) -> int:
    """The lowest layer whose linears stay gathered after their forward: zero3_layers_kept's count on the
    trace's elements (``per_layer``: the largest layer's), :math:`2 k P_{layer} + P_{head}` under the reuse
    distance; a freeze run whose backward stops at its lowest trained layer releases the frozen ones below,
    which have no backward use."""
    room = DS_MAX_REUSE_DISTANCE - model.lm_head_params
    kept_from = model.n_layers - (min(model.n_layers, -(-room // (2 * max(per_layer, 1)))) if room > 0 else 0)
    if setup.method == "freeze" and not embedding_output_requires_grad(setup):
        kept_from = max(kept_from, model.n_layers - min(setup.freeze_trainable_layers, model.n_layers))
    return kept_from


def dequantized_bytes(m: Linear, double_quant: bool, compute: int) -> int:
    """Bytes bitsandbytes' ``dequantize_4bit`` (functional.py) holds while a 4-bit linear's forward runs,
    beside its gathered packed codes: the whole weight in the compute dtype, and under double quantization
    the nested absmax dequantized to fp32 (one per 64-element block, ``absmax + offset`` made before the
    weight and freed after it):

    .. math:: D = d_{in} d_{out} c + 4 \\frac{d_{in} d_{out}}{64} [\\text{double quant}]"""
    return dequantized_elements_bytes(m.d_in * m.d_out, double_quant, compute)


def dequantized_elements_bytes(numel: int, double_quant: bool, compute: int) -> int:
    """:func:`dequantized_bytes` of a weight of ``numel`` elements."""
    return numel * compute + (numel // NF4_BLOCK * 4 if double_quant else 0)


def zero3_head_popped_forward(model: ModelSpec, setup: TrainSetup, prefetch_bucket: int,
                              targets: frozenset[str], compute: int = 2,
                              model_code: str = "hf") -> tuple[int, int, bool]:
    """(bytes ZeRO-3 holds gathered at the decoder linear where the most is gathered once the prefetcher
    has popped the head in the forward of a LoRA, QLoRA or freeze run (module docstring), the decoder
    layers whose forward ran before that linear's, whether that linear is in its layer's MLP block, past
    the layer's attention):
    (0, 0, False) when it pops it only at the head's own fetch, or the run is not one.
    ``compute``: bytes of a 16-bit gathered element; ``model_code``: what bitsandbytes quantizes
    (bnb_scope.quantized).

    ``_fetch_sub_module_impl`` (DeepSpeed 0.19.8), complete trace: every module fetch pops weights from the
    trace queue while ``numel_prefetching < min(stage3_max_live_parameters - n_available,
    prefetch_bucket)`` (the last one overshooting); ``__release_param`` takes a released weight off
    ``n_available`` (``release_sub_module`` after each linear's forward, :func:`forward_walk`), which frees
    its memory (``zero3_linear_wrap`` saves the parameter, not a view of it). The queue so runs about
    ``M = stage3_max_live_parameters`` elements ahead of the forward; the untied head, the forward trace's
    last weight, is popped at the first fetch after a release brings the weights still to run under ``M``,
    and all of them stay gathered beside it until they run:

    .. math:: G = B_{head} + \\sum_{\\text{linears not yet run}} B + B_r [\\#r > 1] + D

    in bytes (``B``), with the round ``r`` the linear's weight came in, when coalesced, held twice: its flat
    buffer stays filed under the round's later weights until the last one is fetched
    (``AllGatherCoalescedHandle.wait`` gives each weight its copy); ``D`` a 4-bit linear's dequantized
    weight (:func:`dequantized_bytes`), so the linear where the most is held may be a wider one after more
    releases. (simulate: Qwen3-32B, 4 layers, LoRA on
    the attention over 8 GPUs: the head's 7.779e8 elements popped at layer 2's first fetch, ``n_available``
    1.7536e9 there, the q, k and v round's 5.24e7-element flat buffer beside it at layer 2's ``q_proj``;
    Qwen2.5-14B, LoRA on the MLP with checkpointing: the head popped after layer 0's ``gate_proj``,
    1.7485e9; Qwen2.5-72B, LoRA of rank 128 on every linear over 2 GPUs: the head's round, popped at layer
    2's ``down_proj`` with layer 3's partitioned ``down_proj.lora_B``, waited for at that ``lora_B`` and held
    twice there, 2.4925e9 elements; Llama-3.1-70B, QLoRA over 4 GPUs: the head popped at layer 1's
    ``down_proj`` beside the packed weights of layers 2 and 3, ``n_available`` 1.9063e9; gemma-7b, 4
    layers, freeze of the top 2 over 4 GPUs: the tied embedding's 7.864e8 elements popped alone at layer
    1's fetch, beside the rounds of layers 1 to 3, 1.667e9 elements at layer 1's ``q_proj``.)"""
    # a tied head's weight is the embedding's: a pop of its own once released after the embedding's forward
    tied = setup.method == "freeze" and embedding_released_after_forward(model, setup)
    head = model.lm_head_params or (model.embed_params if tied else 0)
    if setup.method not in ("lora", "qlora", "freeze") or not head or not model.embed_params:
        return 0, 0, False
    if any(m.role == "expert" for spec, _ in model.layer_groups for m in spec.linears):
        # routed experts are fetched as transformers' fused stacks, in rounds of their own
        # (zero3_expert_round.py), not one trace entry per expert
        return 0, 0, False
    trace, nbytes, layers, dequant, in_mlp, events = forward_walk(model, setup, targets, compute, model_code)
    round_of: list[list[int]] = [[] for _ in trace]  # the indices popped in the same round
    popped, available, held_bytes, best, below, past_attention = 0, 0, 0, 0, 0, False
    for kind, i in events:
        if kind == "fetch":
            limit = min(DS_MAX_LIVE_PARAMETERS - available, prefetch_bucket)
            taken: list[int] = []
            count = 0
            while popped < len(trace) and count < limit:
                taken.append(popped)
                count += trace[popped]
                popped += 1
            for j in taken:
                round_of[j] = taken
            available += count
            held_bytes += sum(nbytes[j] for j in taken)
        elif kind == "release":
            available -= trace[i]
            held_bytes -= nbytes[i]
        elif i == len(trace) - 1:  # the head's own use: what the loss holds is counted there
            break
        else:
            if i >= popped:  # not prefetched: gathered by its own fetch
                available += sum(trace[popped:i + 1])
                held_bytes += sum(nbytes[popped:i + 1])
                popped = i + 1
            if popped == len(trace):
                r = round_of[i]
                held = (held_bytes + (sum(nbytes[j] for j in r) if len(r) > 1 and i != r[-1] else 0)
                        + dequant[i])
                if held > best:
                    best, below, past_attention = held, layers[i], in_mlp[i]
    return best, below, past_attention


def zero3_forward_most(run: Run, prefetch_bucket: int) -> tuple[int, int, bool]:
    """The forward's most gathered once the prefetcher pops the head, as :func:`zero3_head_popped_forward`
    returns it: the largest of that walk's and the coordinator replayed over the step's module trace, for a
    QLoRA run under checkpointing (:func:`zero3_replayed_forward_linear`) or a dense 16-bit LoRA
    one (zero3_lora_top_backward.zero3_lora_forward_bytes), each (0, 0, False) where it does not apply."""
    model, setup = run.model, run.setup
    return max(zero3_head_popped_forward(model, setup, prefetch_bucket, run.targets, run.dtypes.compute,
                                         run.profile.model_code),
               zero3_replayed_forward_linear(run, prefetch_bucket),
               zero3_lora_forward_bytes(run, prefetch_bucket))


def zero3_replayed_forward_linear(run: Run, prefetch_bucket: int) -> tuple[int, int, bool]:
    """(bytes held at the forward's 4-bit linear where the most is held, the decoder layers whose forward
    ran before it, whether it is in its layer's MLP block) in a dense QLoRA run under checkpointing, from
    :func:`step_events` replayed; (0, 0, False) for other runs.

    At each 4-bit base weight's forward fetch, what the replay holds gathered (the prefetcher's rounds
    run ahead, the head among them, their coalesced flat buffers filed until their last parameter is
    fetched, the copies made at a round's first wait) and the weight bitsandbytes dequantizes for the
    matmul (:func:`dequantized_bytes`):

    .. math:: G = \\max_{\\text{4-bit } l} \\big(R_l + d_{in} d_{out} c + 4 d_{in} d_{out} / 64\\, [dq]\\big)

    (simulate: Yi-1.5-6B, 4 layers, QLoRA nf4 on the attention with checkpointing over 4 GPUs, second
    micro-batch: at layer 3's ``up_proj`` the head's round flat buffer and its copy, made there, the
    embedding popped at layer 0's input norm, the packed layers and ``up_proj``'s dequantized weight.)"""
    if not replayable(run) or run.setup.quant_bits is None:
        return 0, 0, False
    key = f"zero3_replay_forward_linear:{prefetch_bucket}"
    if key not in run.memo:
        events, top, rows = replayed_step(run, prefetch_bucket)
        loss = max(i for i in range(top.start) if events[i][2] == "F")
        bits, compute = run.setup.quant_bits, run.dtypes.compute
        best, layers = (0, 0, False), 0
        for i, (action, m, _) in enumerate(events[:loss + 1]):
            if action == "release" and m.role == "layer":
                layers += 1
            packed = m.params[0] if m.role in ("attn", "mlp") and m.params else None
            if action != "fetch" or packed is None or packed.nbytes != 1:
                continue
            dequant = dequantized_elements_bytes(packed.numel * 8 // bits, run.setup.double_quant, compute)
            if rows[i] + dequant > best[0]:
                best = (rows[i] + dequant, layers, m.role == "mlp")
        run.memo[key] = best
    out: tuple[int, int, bool] = run.memo[key]
    return out
