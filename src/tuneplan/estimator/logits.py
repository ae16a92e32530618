"""The logits and loss chain: usually the largest transient of a fine-tune with a big vocabulary.

transformers ``ForCausalLMLoss`` (loss_utils.py) upcasts the logits with ``logits.float()`` and calls
``cross_entropy``: at the loss the 16-bit logits (c bytes), the fp32 copy (4) and the fp32 log-softmax
output (4) coexist; log-softmax keeps its output for backward. In backward, ``nll_loss_backward`` makes
a dense fp32 gradient (4) and ``log_softmax_backward`` another (4) while the saved output (4) is still
alive: 12 bytes per token per vocabulary entry (canifinetune measured ~14 on Qwen2.5, which includes the
lm_head weight-gradient path; see the prior-art notes, e.5).
Chunked losses keep less:
- LitGPT (``lm_head_chunk_size=128``, ``chunked_cross_entropy``): 16-bit logits and 16-bit log-softmax
  output of every chunk are kept: 2 + 2 bytes;
- torchtune ``CEWithChunkedOutputLoss`` (8 chunks, each upcast to fp32): 16-bit logits plus fp32
  log-softmax of every chunk, plus one fp32 chunk in flight: 2 + 4 + 4/8 bytes;
- LitGPT under Lightning Fabric ("fabric_chunked"): the same chunks, but Fabric's half-precision plugins
  cast the module's outputs to the default dtype (``HalfPrecision.convert_output`` /
  ``BitsandbytesPrecision.convert_output``: fp32), so the loss runs on fp32 chunks. LitGPT's loop keeps
  ``logits`` bound through backward and the optimizer step until the next micro-batch rebinds it:
  at the cast, the previous micro-batch's fp32 logits (4, ``held``), the new 16-bit chunks (2) and their
  fp32 copies (4) coexist; the loss keeps the fp32 chunks and their log-softmax (4 + 4); the backward of
  the chunked loss holds the fp32 logits (4), every chunk's fp32 gradient (4) and, for the chunk in flight,
  its nll gradient, log-softmax gradient and saved output (3 x 4 / n chunks); afterwards the fp32 logits
  stay held (4) until the next forward returns;
- torchtune before its chunked loss (0.1-0.2, "torchtune_legacy"): the model returns
  ``output(h).float()`` (the 16-bit logits, 2, and their fp32 cast, 4, at the cast), the recipe makes a
  contiguous fp32 copy of the shifted logits (4 + 4 while the cast dies) and keeps it bound until the next
  iteration (``held``, 4); backward: that copy, the saved fp32 log-softmax and the nll and log-softmax
  gradients, 4 + 4 + 4 + 4;
- the same loss compiled (torchtune ``compile=True`` compiles ``compute_cross_entropy``,
  "chunked_compiled"): inductor fuses the upcast into the loss kernel and keeps each chunk's 16-bit
  logits (2) for backward instead of an fp32 log-softmax; one chunk's fp32 values are in flight (4 / n);
  backward makes every chunk's 16-bit gradient (2) before the output projection's backward;
- fused linear cross-entropy (Liger ``LigerFusedLinearCrossEntropyFunction``, Apple's cut cross-entropy,
  "fused_linear"): the lm_head matmul runs per token chunk sized so that a chunk's logits match the
  hidden states (Liger: ``inc_factor = cdiv(V, H)``, ``chunk_size = next_pow2(cdiv(BT, inc_factor))``),
  and the input gradient is computed in the forward (``grad_input = zeros_like(_input)``): a 16-bit
  tokens x hidden gradient, one chunk of logits of about the same size, an fp32 loss per token; no
  tokens x vocabulary tensor ever exists;
- Unsloth's fused cross-entropy writes the gradient into the 16-bit logits in place: 2 bytes + an fp32
  log-sum-exp per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuneplan.estimator.xp import ceil_div, maximum

if TYPE_CHECKING:
    from tuneplan.estimator.run import Run

# the chains logits_plan names; every other loss (``hf`` ...) takes the default chain
OTHER_CHAINS = frozenset({"fused_linear", "fabric_chunked", "torchtune_legacy", "chunked_compiled",
                          "chunked_bf16", "chunked_fp32", "fused"})
TORCHTUNE_CHUNKS = 8  # torchtune CEWithChunkedOutputLoss(num_output_chunks=8)
LITGPT_CHUNK = 128  # litgpt finetune/*.py: model(input_ids, lm_head_chunk_size=128)


@dataclass(slots=True)
class LogitsPlan:
    """The chain's live bytes at one shape (or a grid's arrays); not frozen, with slots: one is made per
    estimate."""

    at_forward_end: int  # live at the end of the model's forward, before the loss
    forward_peak: int  # extra live during the loss forward
    backward_peak: int  # extra live at the start of backward (loss backward)
    held: int = 0  # kept by the training loop through backward, the optimizer step and the next forward
    cast_peak: int = 0  # live while the outputs are cast (beside what the previous micro-batch holds)


def default_chain(compute_bytes: int, softmax_keeps_input: bool = False, softcap: bool = False,
                  upcast: bool = True) -> tuple[int, int, int]:
    """The default chain's bytes per logit element (tokens x vocabulary), shape-independent (resolved once
    per run: ``memory_statics``): (at the forward's end, during the loss forward, at the loss backward),
    each a sum of integer byte widths, so ``width x elements`` is the sum of the terms' products exactly.
    With ``c`` the logits' bytes and ``l`` the loss's (4, or ``c`` when nothing upcasts them): the forward's
    end holds the logits (``c``, and ``c`` more for the capped copy ``tanh`` saves); the loss forward the
    logits, their upcast copy (``l`` when ``l != c``), the log-softmax output (``l``) and the capped copy;
    the loss backward the saved output and both dense gradients (``3 l``), torch < 1.11's kept upcast input
    (``l``) and the capped copy."""
    loss_bytes = 4 if upcast else compute_bytes
    upcast_copy = loss_bytes if compute_bytes != loss_bytes else 0  # .float() of the logits
    # torch < 1.11: log_softmax also kept its input, the upcast logits, until its backward had run
    kept = loss_bytes if softmax_keeps_input else 0
    capped = compute_bytes if softcap else 0
    return (compute_bytes + capped, compute_bytes + upcast_copy + loss_bytes + capped,
            3 * loss_bytes + kept + capped)


def logits_plan(tokens: Any, vocab: int, compute_bytes: int, loss: str, seq: Any = 0,
                hidden: int = 0, softmax_keeps_input: bool = False, softcap: bool = False,
                upcast: bool = True) -> LogitsPlan:
    """The chain's live bytes, linear in ``tokens`` x vocabulary (``tokens`` and ``seq`` may be numpy arrays
    of a grid: see ``estimator/xp.py``). ``softcap``: the model caps its logits (Gemma-2's
    ``final_logit_softcapping``: ``logits / cap``, ``tanh``, ``* cap`` in transformers'
    Gemma2ForCausalLM.forward); ``tanh`` saves its output for backward, one more c-byte tokens x vocabulary
    tensor from the forward's end until the loss backward has run (the default chain only). ``upcast``
    False: the loss runs in the compute dtype (a model that hands its scores to ``CrossEntropyLoss``
    without ``.float()``, such as transformers' BertForMaskedLM, outside autocast, whose fp32 list holds
    ``log_softmax``): the log-softmax output and both gradients are c-byte tensors."""
    logit_elems = tokens * vocab
    if loss not in OTHER_CHAINS:  # the default chain, nearly every estimate's: one test, not seven
        at_end, forward, backward = default_chain(compute_bytes, softmax_keeps_input, softcap, upcast)
        # (positional: the default chain is the one nearly every estimate takes; keywords cost a third of a
        # microsecond)
        return LogitsPlan(at_end * logit_elems, forward * logit_elems, backward * logit_elems)
    logits = compute_bytes * logit_elems  # the model's logits, in its compute dtype
    if loss == "fused_linear":
        head_input_elems = tokens * min(hidden or vocab, vocab)
        # the chunk is rounded up to a power of two tokens: up to twice the hidden-sized target
        head_input = compute_bytes * head_input_elems
        return LogitsPlan(at_forward_end=0, forward_peak=head_input + 2 * head_input + 4 * tokens,
                          backward_peak=head_input)
    # the fp32 cast of the model's c-byte logits (nothing new when they already are fp32)
    cast = 4 * logit_elems if compute_bytes != 4 else 0
    if loss == "fabric_chunked":
        chunks = maximum(1, ceil_div(seq, LITGPT_CHUNK))
        return LogitsPlan(at_forward_end=logits, forward_peak=8 * logit_elems,
                          backward_peak=8 * logit_elems + 8 * logit_elems // chunks, held=4 * logit_elems,
                          cast_peak=logits + cast)
    if loss == "torchtune_legacy":
        return LogitsPlan(at_forward_end=logits, forward_peak=8 * logit_elems, backward_peak=16 * logit_elems,
                          held=4 * logit_elems, cast_peak=logits + cast)
    if loss == "chunked_compiled":
        chunk = 4 * logit_elems // TORCHTUNE_CHUNKS
        return LogitsPlan(at_forward_end=logits, forward_peak=logits + chunk, backward_peak=logits + chunk)
    if loss == "chunked_bf16":
        return LogitsPlan(at_forward_end=2 * logit_elems, forward_peak=4 * logit_elems,
                          backward_peak=4 * logit_elems)
    if loss == "chunked_fp32":
        chunk = 4 * logit_elems // TORCHTUNE_CHUNKS
        return LogitsPlan(at_forward_end=2 * logit_elems, forward_peak=6 * logit_elems + chunk,
                          backward_peak=4 * logit_elems + 2 * chunk)
    # "fused", the last of OTHER_CHAINS
    return LogitsPlan(at_forward_end=2 * logit_elems, forward_peak=2 * logit_elems + 4 * tokens,
                      backward_peak=2 * logit_elems)


def logits_terms(run: Run) -> dict[str, Any]:
    """The logits chain's arguments (:func:`logits_plan`) besides the shape, by MemoryStatics field: the
    logits' bytes (the compute dtype under autocast, else the head's), and whether the loss is upcast to
    fp32: an encoder's masked-LM head hands its scores to CrossEntropyLoss without .float() (transformers
    BertForMaskedLM.forward), so its loss is fp32 only under autocast (DeepSpeed runs without it)."""
    model, setup, dtypes = run.model, run.setup, run.dtypes
    terms: dict[str, Any] = {
        "vocab": model.head_width, "hidden": model.hidden, "softmax_keeps_input": setup.softmax_keeps_input,
        "logit_bytes": (dtypes.compute if dtypes.autocast
                        else (dtypes.trainable if setup.method == "full" else dtypes.non_block)),
        "softcap": bool(model.config.get("final_logit_softcapping")) and not setup.num_labels,
        "upcast": dtypes.autocast or model.architecture != "encoder",
    }
    terms["logits_per_elem"] = (None if run.loss in OTHER_CHAINS else
                                default_chain(terms["logit_bytes"], terms["softmax_keeps_input"],
                                              terms["softcap"], terms["upcast"]))
    return terms
