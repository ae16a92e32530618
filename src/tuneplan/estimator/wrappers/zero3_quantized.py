"""What ZeRO-3's prefetcher holds gathered at the loss of a QLoRA run, whose decoder linears are
bitsandbytes ``Params4bit`` partitioned as packed bytes: their trace elements are those bytes, so the module
trace is short and the prefetcher runs ahead through it."""

from __future__ import annotations

from collections import deque
from itertools import accumulate
from typing import TYPE_CHECKING

from tuneplan.estimator.bnb_scope import expert_stack_bytes, quantized
from tuneplan.estimator.lora_bottom_layer import bottom_gradient_free_params
from tuneplan.estimator.wrappers.reduce_buckets import zero3_leaf_moe
from tuneplan.estimator.wrappers.zero3_coordinator import (
    DS_MAX_LIVE_PARAMETERS,
    DS_MAX_REUSE_DISTANCE,
    DS_PARAM_PERSISTENCE_THRESHOLD,
    HOOKED_CONTAINERS_PER_LAYER,
    prefetch_rounds,
    zero3_kept_params,
)
from tuneplan.specs.model import LayerSpec, ModelSpec
from tuneplan.specs.setup import TrainSetup

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run


def zero3_quantized_ahead_bytes(model: ModelSpec, setup: TrainSetup, prefetch_bucket: int,
                                compute: int) -> int:
    """Bytes gathered at the loss of a QLoRA run with checkpointing once the prefetcher has run ahead to the
    token embedding's backward use (0 when it does not).

    DeepSpeed 0.19.8 partitions a bitsandbytes ``Params4bit`` (bitsandbytes/nn/modules.py) like any
    parameter: its ``ds_numel`` is the packed ``uint8`` count, ``bits / 8`` per weight. With checkpointing
    ``enable_input_require_grads`` makes the embedding's output require grad, so its backward fetch is the
    step's last parameter use (as zero3_coordinator.prefetch_reach for LoRA). Every parameter has a backward
    use; when the fetches of a layer's modules grant more than the layer holds and everything but the
    embedding fits under ``stage3_max_live_parameters`` ``M``, the round that crosses pops the embedding
    too, and all of the model is gathered at the loss:

    .. math:: G = (E + H + N) c + \\frac{b}{8} \\sum_{\\text{layers}} W

    with ``E``, ``H``, ``N`` the embedding, head and norm elements in the compute dtype ``c`` bytes, ``W``
    the layers' linear weights. (simulate: GLM-4-9B, 2 layers, QLoRA fp4 on q/v with checkpointing over 2
    GPUs: the embedding INFLIGHT beside the head and both layers' packed weights at the loss.) When
    the head and the layers reach ``M``, the prefetcher stops there plus the packed parameter crossing it,
    with or without checkpointing (the queue holds layer parameters there, the embedding's use or not):

    .. math:: G = H c + (M - H) + \\max_p \\frac{b}{8} W_p

    (simulate: Llama-2-13b, 8 layers, QLoRA nf4 on q/v in bf16 over 2 GPUs, with and without
    checkpointing.)"""
    bits = setup.quant_bits
    if bits is None or not model.embed_params:
        return 0
    packed = [(spec.linear_params * bits // 8, spec.norm_params, len(spec.linears), count)
              for spec, count in model.layer_groups]
    fetches = max(n + 2 + HOOKED_CONTAINERS_PER_LAYER for _, _, n, _ in packed)
    if fetches * prefetch_bucket < max(w + norm for w, norm, _, _ in packed):
        return 0
    layers = sum((w + norm) * count for w, norm, _, count in packed)
    embed, head = model.embed_params, model.lm_head_params
    if not head and embed >= DS_MAX_LIVE_PARAMETERS and layers < DS_MAX_REUSE_DISTANCE:
        return 0  # zero3_coordinator.tied_embedding_fills_live on the packed trace: nothing is prefetched
    if head + model.final_norm_params + layers >= DS_MAX_LIVE_PARAMETERS:
        # a layer's packed parameter crosses M before the embedding (zero3_coordinator.prefetch_reach):
        # M elements, the head among them (tied: the embedding's weight) in c bytes, the rest packed, one
        # byte each, plus the parameter that crosses
        held = head or embed
        largest = max(m.d_in * m.d_out * bits // 8 for spec, _ in model.layer_groups for m in spec.linears)
        return held * compute + DS_MAX_LIVE_PARAMETERS - held + largest
    if not setup.gradient_checkpointing:
        return 0  # the embedding has no backward use: what is kept is zero3_kept_bytes's
    norms = sum(norm * count for _, norm, _, count in packed) + model.final_norm_params
    return (embed + head + norms) * compute + layers - sum(norm * count for _, norm, _, count in packed)


def zero3_kept_bytes(run: Run, head_params: int) -> int:
    """Bytes of the decoder layers ZeRO-3 keeps gathered from their forward to their backward
    (zero3_coordinator.zero3_kept_params), as they are gathered.

    16-bit layers: those elements in the compute dtype. 4-bit layers are partitioned and gathered as
    packed bytes (module doc), a layer's weights as :func:`gathered_entries` gives them (its norms are
    persistent, gathered for the run); without checkpointing the bottom layer's linears with no backward
    use (``lora_bottom_layer``: nothing below them requires grad) are released after their forward and
    never fetched again, ``b/8`` bytes a weight:

    .. math:: K = k \\max_{\\text{layers}} \\sum_p B_p
              - [k = L,\\ \\text{no checkpointing}]\\ \\frac{b}{8} \\sum_{\\text{free}} W

    with ``k`` as ``zero3_layers_kept`` counts it, on the packed trace elements of a layer. (simulate:
    Llama-2-13b, 2 layers, QLoRA nf4 on the MLP in fp32 over 2 GPUs: at the loss the head and the
    layers' packed copies, not the released embedding.)"""
    model, setup = run.model, run.setup
    bits = setup.quant_bits
    if bits is None:
        return zero3_kept_params(model, setup, head_params, run.targets) * run.dtypes.compute
    layers = [gathered_entries(run, spec) for spec, _ in model.layer_groups]
    # zero3_layers_kept's count on the packed trace: 2 k P_layer + P_head under the reuse distance
    per_layer = max(max(sum(n for n, _ in entries) for entries in layers), 1)
    room = DS_MAX_REUSE_DISTANCE - head_params
    k = min(model.n_layers, -(-room // (2 * per_layer))) if room > 0 else 0
    kept = k * max(sum(b for _, b in entries) for entries in layers)
    if k >= model.n_layers and not setup.gradient_checkpointing:
        kept -= bottom_gradient_free_params(model, run.targets) * bits // 8
    return kept


def zero3_quantized_at_embedding_bytes(run: Run, prefetch_bucket: int) -> int:
    """Bytes ZeRO-3 holds gathered at the token embedding's forward in a QLoRA run with a complete trace:
    ``zero3_coordinator.zero3_gathered_at_embedding``'s rounds over a trace whose 4-bit weights count
    their packed bytes (module doc), each entry in its own bytes: a packed weight one byte an element,
    the embedding, the head and the fused experts (``bnb_scope``: not quantized) their dtype.

    .. math:: G = \\sum_{r < n_{fetch}} \\sum_{p \\in r} n_p\\, b_p

    (simulate: Phi-3-mini, 2 layers, QLoRA nf4 in fp32 over 2 GPUs: at the embedding's forward of the
    second step the embedding and the head (9.85e7 elements each, fp32) beside both layers' packed rounds,
    5.66e7 bytes each.) A root's round holding more than the embedding (one under the bucket) is coalesced:
    its flat buffer, :math:`\\sum_{p \\in r_0} n_p b_p` more, stays until its last member's fetch (simulate:
    gpt2, 3 layers, QLoRA nf4 in fp32 over 2 GPUs: the whole model in the root's round, its flat buffer
    beside the copies at layer 2's ``c_fc``)."""
    model, setup, dtypes = run.model, run.setup, run.dtypes
    bits = setup.quant_bits
    if bits is None or not model.embed_params:
        return 0
    trace = [(model.embed_params, dtypes.non_block)]
    for spec, count in model.layer_groups:
        trace += [(n, b // n) for n, b in gathered_entries(run, spec)] * count
    if model.lm_head_params:
        trace.append((model.lm_head_params, dtypes.non_block))
    wrappers = 4  # the causal-LM model and its base model, PEFT's PeftModel and LoraModel above them
    rounds = prefetch_rounds([n for n, _ in trace], prefetch_bucket)[:wrappers + 1]
    # the root's round, coalesced when the embedding is under the bucket: its flat buffer stays beside the
    # copies until its last member's fetch, past the embedding's (AllGatherCoalescedHandle.wait)
    flat = sum(n * b for n, b in trace[:len(rounds[0])]) if len(rounds[0]) > 1 else 0
    return sum(n * b for n, b in trace[:sum(len(r) for r in rounds)]) + flat


def gathered_entries(run: Run, spec: LayerSpec) -> list[tuple[int, int]]:
    """(trace elements, bytes) of each weight of one decoder layer of a quantized run in forward order,
    as ZeRO-3 partitions and gathers it: a 4-bit ``Params4bit`` as its packed ``uint8`` codes
    (``bits / 8`` an element: ``ds_numel`` is the packed count), a fused expert stack (``bnb_scope``: not
    quantized) whole in its dtype, one entry per expert as ``zero3_coordinator.forward_trace`` has them;
    biases and norms left out."""
    bits = run.setup.quant_bits or 16
    stack = expert_stack_bytes(run.setup.quant_bits, run.dtypes)
    out = []
    for m in spec.linears:
        if quantized(m, run.profile.model_code):
            packed = m.d_in * m.d_out * bits // 8
            out += [(packed, packed)] * m.count
        else:
            out += [(m.params // m.count, m.params // m.count * stack)] * m.count
    return out


def zero3_quantized_head_copy_bytes(run: Run, prefetch_bucket: int) -> int:
    """Bytes a QLoRA run's untied output head holds beyond itself before its forward in the first pass with
    a complete trace (0 with a tied head, or when the head is gathered alone).

    A round of more than one parameter is gathered coalesced (``all_gather_coalesced`` ->
    ``_all_gather_coalesced``, one flat buffer per dtype, DeepSpeed 0.19.8); the first fetch of one of its
    parameters waits for it and ``AllGatherCoalescedHandle.wait`` gives every parameter a copy
    (``torch.cat(partitions)``) while the flat buffers stay filed under the head until its own fetch
    (zero3_coordinator.zero3_head_round_first_pass, the 16-bit case):

    .. math:: \\Delta G = P_{head}\\, b_{nb} + \\sum_{p \\in R} n_p b_p

    with ``R`` the other parameters of the head's round (:func:`head_round_members`). With gradient
    accumulation the first complete pass is the first step's second micro-batch; the record pass released
    the persistent final norm too (zero3_first_pass.py) and the norm, NOT_AVAILABLE, starts the round
    ``[norm, head]``: ``R`` is the norm. (simulate: Qwen2.5-32B, 3 layers, QLoRA fp4 in fp32 over 2 GPUs
    without checkpointing: the 7.7857e8-element flat buffer beside the head's copy at ``model.norm`` in the
    second micro-batch of the first step, the run's peak.) A single parameter is gathered into its own
    buffer (``_all_gather_sequential``): no copy."""
    model = run.model
    norm = model.final_norm_params
    if run.setup.quant_bits is None or not model.lm_head_params:
        return 0
    # the queue below has each expert as its own entry; a ZeRO-3 leaf MoE block is fetched whole
    # (zero3_expert_round.py), a queue not derived here: those keep the norm's round
    if run.setup.grad_accum < 2 and not zero3_leaf_moe(model, run.profile.model_code == "hf"):
        members = head_round_members(run, prefetch_bucket)
        return model.lm_head_params * run.dtypes.non_block + sum(n * b for n, b in members) if members else 0
    if not 0 < norm <= DS_PARAM_PERSISTENCE_THRESHOLD:
        return 0
    return (model.lm_head_params + norm) * run.dtypes.non_block


def head_round_members(run: Run, prefetch_bucket: int) -> list[tuple[int, int]]:
    """(elements, bytes an element) of the parameters the prefetcher pops in one round with the untied
    head in the second step's forward, the first pass with a complete trace of a run without gradient
    accumulation (empty: the head is alone, or never prefetched).

    The first step's optimizer step has gathered the persistent parameters again
    (``DeepSpeedZeroOptimizer_Stage3._post_step``: ``persistent_parameters[0].all_gather``): the norms,
    biases and LoRA matrices of at most ``stage3_param_persistence_threshold`` elements are AVAILABLE and
    ``_fetch_sub_module_impl`` skips them uncounted (``do_prefetch`` only for NOT_AVAILABLE). The queue left
    holds, in fetch order, the embedding, each layer's weights as :func:`gathered_entries` gives them with a
    LoRA target's larger matrices around its base weight (``lora_A``, ``r d_in``, recorded before the base
    layer, its second use skipped as INFLIGHT; ``lora_B``, ``d_out r``, after it), then the head; it is cut
    into rounds (zero3_coordinator.prefetch_rounds) and the head's round is read off. (simulate:
    Qwen3-8B, 3 layers, QLoRA nf4 rank 4 on q/v in fp32 over 2 GPUs: the top ``down_proj``'s 2.5166e7 codes
    and the head in one round, the head's copy made at that ``down_proj``; Meta-Llama-3-8B-Instruct,
    4 layers, rank 16 on every linear: the round ends at the top ``down_proj``, its ``lora_A`` before it,
    and the head, 5.2534e8 elements, is gathered alone.)"""
    trace = second_step_trace(run)
    if not trace or trace[-1][0] != run.model.lm_head_params:
        return []  # a persistent (classifier) head is no entry of the queue
    released = run.model.embed_params if embedding_released(run, trace) else 0
    for r in cut_rounds(trace, prefetch_bucket, released, resume=True):
        if r[-1] is trace[-1]:
            return r[:-1]
    return []


def second_step_trace(run: Run) -> list[tuple[int, int]]:
    """(elements, bytes an element) of the parameters the second step's forward queues NOT_AVAILABLE, in
    fetch order (:func:`head_round_members`): the embedding, each layer's weights as
    :func:`gathered_entries` gives them with a LoRA target's matrices past
    ``stage3_param_persistence_threshold`` (``lora_A`` before the base weight, ``lora_B`` after it), the
    untied head past it."""
    model, dtypes, rank = run.model, run.dtypes, run.setup.rank
    trace = [(model.embed_params, dtypes.non_block)]
    for spec, count in model.layer_groups:
        entries, layer = iter(gathered_entries(run, spec)), []
        for m in spec.linears:
            lora = (rank * m.d_in, m.d_out * rank) if m.name in run.targets else (0, 0)
            for _ in range(m.count):
                n, b = next(entries)
                layer += [(lora[0], dtypes.adapter)] if lora[0] > DS_PARAM_PERSISTENCE_THRESHOLD else []
                layer.append((n, b // n))
                layer += [(lora[1], dtypes.adapter)] if lora[1] > DS_PARAM_PERSISTENCE_THRESHOLD else []
        trace += layer * count
    if model.lm_head_params > DS_PARAM_PERSISTENCE_THRESHOLD:
        trace.append((model.lm_head_params, dtypes.non_block))
    return trace if model.embed_params else []


def embedding_released(run: Run, trace: list[tuple[int, int]]) -> bool:
    """Whether ``__params_to_release`` releases the embedding after its forward: its next use, its backward
    (module doc of :func:`zero3_quantized_ahead_bytes`), lies past the layers' forward and backward (and
    recompute) and the head's two uses, beyond ``stage3_max_reuse_distance``
    (zero3_first_pass.embedding_regathered). A tied embedding, the head's weight, is used next by the
    head's forward right after the layers' (zero3_first_pass.embedding_released_after_forward)."""
    head = run.model.lm_head_params if trace[-1][0] == run.model.lm_head_params else 0
    layers = sum(n for n, _ in trace[1:]) - head
    if not run.model.lm_head_params and run.model.tied_embeddings:
        return layers >= DS_MAX_REUSE_DISTANCE
    passes = 3 if run.setup.gradient_checkpointing else 2
    return passes * layers + 2 * head >= DS_MAX_REUSE_DISTANCE


def cut_rounds(trace: list[tuple[int, int]], prefetch_bucket: int,
               released: int, resume: bool = False) -> list[list[tuple[int, int]]]:
    """The trace cut into rounds as zero3_coordinator.prefetch_rounds cuts them (round ``k`` popped at the
    ``k``-th module fetch), with ``released`` elements (the embedding) no longer available from the first
    fetch after the embedding's (the four wrappers above it and the embedding pop the first five rounds;
    ``release_sub_module`` after its forward lowers ``__n_available_params``).

    Where the limit ``min(M - A, bucket)`` is not positive the prefetcher pops nothing at that fetch. At the
    embedding's own fetch the cut goes on (an empty round): its release after its forward lowers ``A`` by
    ``released`` before the next fetch (simulate: Qwen2.5-32B, 3 layers, QLoRA nf4 on the attention with
    checkpointing over 2 GPUs: nothing popped at the embedding, the rounds resumed at the rotary module);
    an embedding of at least ``M`` popped by the root's fetch leaves the wrappers below it nothing either
    (simulate: gemma-2-27b, 2 layers, QLoRA fp4 on the MLP with checkpointing and a 1-label head over 8
    GPUs: empty rounds to the embedding's forward, the rounds resumed at the rotary module).
    Elsewhere, without ``resume`` the cut stops there; with it the forward goes on (:func:`blocked_walk`):
    each fetch uses the next entry, gathered on demand when no round has popped it, and releases it after its
    forward when its next use lies beyond ``stage3_max_reuse_distance``, so that the prefetcher resumes."""
    if resume:
        return blocked_walk(trace, prefetch_bucket, released)
    wrappers = 4  # the causal-LM model and its base model, PEFT's PeftModel and LoraModel above them
    queue, available = list(trace), 0
    rounds: list[list[tuple[int, int]]] = []
    while queue:
        if len(rounds) == wrappers + 1:
            available -= released
        limit = min(DS_MAX_LIVE_PARAMETERS - available, prefetch_bucket)
        if limit <= 0 and len(rounds) <= wrappers and released:
            # fetch_sub_module pops nothing at the embedding's own fetch (nor, the embedding past M, at
            # the wrappers' fetches after the root's); release_sub_module after its forward frees the
            # limit (an empty round keeps round k at the k-th fetch)
            rounds.append([])
            continue
        if limit <= 0:
            break
        taken: list[tuple[int, int]] = []
        while queue and sum(n for n, _ in taken) < limit:
            taken.append(queue.pop(0))
        rounds.append(taken)
        available += sum(n for n, _ in taken)
    return rounds


def blocked_walk(trace: list[tuple[int, int]], prefetch_bucket: int,
                 released: int) -> list[list[tuple[int, int]]]:
    """The prefetch rounds of the second step's forward fetch by fetch, the prefetcher blocked while the
    gathered elements ``A`` reach ``M`` (``stage3_max_live_parameters``) and resuming as the forward
    releases what it used (DeepSpeed 0.19.8 ``PartitionedParameterCoordinator.fetch_sub_module``: the
    module's own parameters are gathered and popped off the queue, then a round of up to
    ``min(M - A, prefetch_bucket)`` elements; ``release_sub_module`` -> ``__params_to_release``).

    Fetch ``4 + i`` uses entry ``i`` (the four wrappers first; modules without a queued parameter left
    out). Entry ``i > 0`` is released after its forward when its next use, in the backward, lies
    ``2 \\sum_{j > i} n_j`` elements on (the entries above it, the head's two uses among them) at least
    ``stage3_max_reuse_distance``; the embedding when ``released`` is its size. Rounds of one entry
    gathered on demand are not listed. (simulate: Llama-3.1-405B, 2 layers, QLoRA nf4 rank 8 on every
    linear over 2 GPUs: the embedding alone past ``M``, the prefetcher resumes in layer 0 and pops
    ``[down_proj.lora_B, lm_head]`` at layer 1's ``gate_proj``.)"""
    wrappers = 4
    # the queue in fetch order, an entry gathered on demand skipped when its turn comes (linear in the
    # trace: a MoE's trace has one entry per expert, tens of thousands for DeepSeek-V3)
    queue, available, popped = deque(range(len(trace))), 0, set()
    after = list(accumulate((n for n, _ in reversed(trace[1:])), initial=0))[::-1]  # sum of n_j, j > i
    rounds: list[list[tuple[int, int]]] = []
    for fetch in range(wrappers + len(trace)):
        used = fetch - wrappers
        if 0 <= used and used not in popped:  # gathered on demand, popped off the queue
            popped.add(used)
            available += trace[used][0]
        limit = min(DS_MAX_LIVE_PARAMETERS - available, prefetch_bucket)
        taken: list[int] = []
        total = 0
        while queue and limit > 0 and total < limit:
            entry = queue.popleft()
            if entry not in popped:
                taken.append(entry)
                total += trace[entry][0]
        if taken:
            rounds.append([trace[i] for i in taken])
            popped.update(taken)
            available += total
        if used == 0 and released:
            available -= released
        elif used > 0 and 2 * after[used] >= DS_MAX_REUSE_DISTANCE:
            available -= trace[used][0]
        if len(popped) == len(trace):
            break
    return rounds
