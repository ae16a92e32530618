"""ZeRO-3 QLoRA without checkpointing: the coordinator replayed over a trace whose backward fetches only
the modules with an output requiring grad (estimator/wrappers/zero3_plain_trace.py), counted by hand from
DeepSpeed 0.19.8's ``PartitionedParameterCoordinator`` and parameter_offload.py's backward hooks."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.zero3_plain_trace import plain_step_events, zero3_replayed_plain
from tuneplan.specs.model import model_from_config

H, VOCAB = 8192, 65024
FALCON_40B_2L = dict(model_type="falcon", hidden_size=H, num_hidden_layers=2, num_attention_heads=128,
                     num_kv_heads=8, new_decoder_architecture=True, parallel_attn=True, bias=False,
                     multi_query=True, alibi=False, vocab_size=VOCAB)
MISTRAL_2L = dict(model_type="mistral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=2,
                  num_attention_heads=32, num_key_value_heads=8, vocab_size=32768, tie_word_embeddings=False,
                  rope_theta=1e6)


def test_the_bottom_layers_gradient_free_modules_are_not_fetched_in_the_backward() -> None:
    # Mistral, 2 layers, QLoRA on the MLP without checkpointing: the embedding's output does not require
    # grad (no enable_input_require_grads), so in layer 0 the input norm, q/k/v (reading it), the
    # attention core, o_proj and the attention, the post-attention norm, and gate_proj's and up_proj's
    # base layers and dropouts (reading the norm) have outputs without grad: DeepSpeed never fetches them
    # in the backward. down_proj reads act(gate) * up, which requires grad through gate's LoRA: its base
    # layer and dropout are fetched. Layer 1 reads layer 0's output, which requires grad: all fetched.
    # Backward fetches of 4-bit weights: layer 1's q, k, v, o, gate, up, down and layer 0's down: 8.
    spec = model_from_config(MISTRAL_2L, "mistral-2L")
    setup = build_setup(spec, method="qlora", precision="bf16-mixed", gpus=8, zero=3, rank=128, targets="mlp",
                        gradient_checkpointing=False, offload="all", quant_type="fp4")
    events, _ = plain_step_events(resolve_run(spec, setup))
    fetched = [m.role for action, m, kind in events if action == "fetch" and kind == "B"
               and m.role in ("attn", "mlp")]
    assert fetched.count("attn") == 4
    assert fetched.count("mlp") == 4
    assert not [e for e in events if e[2] == "R"]


def test_at_the_loss_the_replay_holds_the_forwards_copies_and_a_filed_flat_buffer() -> None:
    # Falcon-40B, 2 layers (parallel attention, tied head), QLoRA nf4 double-quant rank 16 on the MLP
    # without checkpointing, fp16, parameters offloaded, 2 GPUs. Packed codes, one byte each:
    # query_key_value 9216 x 8192 / 2 = 37,748,736, dense 8192^2 / 2 = 33,554,432, dense_h_to_4h and
    # dense_4h_to_h 32768 x 8192 / 2 = 134,217,728; the LoRA matrices over the 81,920 persistence
    # threshold (10 h): h_to_4h's A 131,072 and B 524,288, 4h_to_h's A 524,288 and B 131,072 elements.
    # At the loss the second step's coordinator holds: the tied embedding for the head's backward,
    # 532,676,608 x 2 = 1,065,353,216; layer 1's four packed weights (recorded for its backward) =
    # 339,738,624; layer 0's dense_4h_to_h, kept: its input, gelu(h_to_4h's LoRA output), requires grad,
    # so its backward fetch lies within the 1e9 reuse distance, = 134,217,728 (layer 0's attention and
    # dense_h_to_4h, reading the gradient-free layer input, are never fetched again: released); the
    # LoRA matrices gathered, three of 131,072 and three of 524,288 elements in fp16 = 3,932,160; and a
    # coalesced round's flat buffer still filed, a 4h_to_h lora_A beside a packed MLP weight:
    # 134,217,728 + 262,144. Total 1,677,721,600 (simulate: the same bytes gathered at the loss of the
    # second step; the closed form for checkpointed runs counts 1,405,091,840).
    spec = model_from_config(FALCON_40B_2L, "falcon-40b-2L")
    setup = build_setup(spec, method="qlora", precision="fp16", gpus=2, zero=3, rank=16, targets="mlp",
                        gradient_checkpointing=False, offload="all", quant_type="nf4", double_quant=True,
                        optimizer="adafactor", dropout=0.05)
    run = resolve_run(spec, setup)
    replayed = zero3_replayed_plain(run, 50_000_000)
    assert replayed is not None
    expected = (1_065_353_216 + 37_748_736 + 33_554_432 + 2 * 134_217_728 + 134_217_728
                + 3 * 262_144 + 3 * 1_048_576 + 134_217_728 + 262_144)
    assert expected == 1_677_721_600
    assert replayed.at_loss == expected
    assert run.wrapper.memory(run, run.stepped_optimizer).gathered.at_loss == expected


def test_checkpointed_runs_are_not_replayed_here() -> None:
    spec = model_from_config(MISTRAL_2L, "mistral-2L")
    setup = build_setup(spec, method="qlora", gpus=2, zero=3, targets="mlp", gradient_checkpointing=True)
    assert zero3_replayed_plain(resolve_run(spec, setup), 50_000_000) is None
