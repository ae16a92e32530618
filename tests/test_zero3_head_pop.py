"""ZeRO-3's prefetcher popping the untied head in a LoRA run's forward (estimator/wrappers/zero3_head_pop.py),
counted by hand on a 4-layer untied Llama."""

from __future__ import annotations

from dataclasses import replace

from tuneplan.api import build_setup
from tuneplan.estimator.activations import saved_at
from tuneplan.estimator.instants import gathered_forward_rows
from tuneplan.estimator.logits import logits_plan
from tuneplan.estimator.memory_statics import memory_statics
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.zero3_head_pop import zero3_head_popped_forward
from tuneplan.estimator.wrappers.zero3_head_pop_running import checkpointed_mlp_in_flight
from tuneplan.specs.model import model_from_config

H, F, V = 4096, 16384, 131072
CFG = dict(model_type="llama", hidden_size=H, num_hidden_layers=4, num_attention_heads=32,
           num_key_value_heads=32, intermediate_size=F, vocab_size=V, tie_word_embeddings=False)


def test_the_head_is_popped_beside_the_layers_not_yet_run() -> None:
    # q, k, v, o: a = H^2 = 16,777,216 each; gate, up, down: b = H F = 67,108,864 each; a layer's linears
    # P = 4a + 3b = 268,435,456; embedding and head V H = 536,870,912. Released after their forward: the
    # embedding (no backward use) and the linears of layers 0-2 (the top one is kept: 1e9 - V H over
    # 2 P_layer rounds up to 1). A prefetch bucket of 1e9 elements, stage3_max_live_parameters 1e9:
    # - the first fetch pops until 1e9: E, layer 0, layer 1's q..up = 1,006,632,960, one coalesced round
    #   the embedding's fetch waits for (copies made, the flat buffer kept until layer 1's up is fetched);
    #   the other wrappers' and the embedding's fetches find n_available over the limit
    # - the embedding released: 469,762,048; the rotary module's fetch pops 530,237,952 or more: layer 1's
    #   down, layer 2, layer 3's q..up (536,870,912) -> 1,006,632,960
    # - layer 0's q released (989,855,744): its dropout's fetch pops layer 3's down (b); k, v, o, gate
    #   released: 939,524,096; up_proj's fetch pops the head: 1,476,395,008, the head and the weights not
    #   yet run (layer 0's up and down, layers 1-3: 2b + 3P)
    # at layer 0's up_proj the first round's flat buffer is still filed under layer 1's up: beside it
    a, b = H * H, H * F
    p = 4 * a + 3 * b
    not_yet_run = 2 * b + 3 * p
    first_round = V * H + p + 4 * a + 2 * b
    spec = model_from_config(CFG, "llama-4L-untied")
    setup = build_setup(spec, method="lora", gpus=2, zero=3, gradient_checkpointing=False)
    targets = frozenset({"q_proj", "v_proj"})
    # ... and no decoder layer's forward has ended: none of their activations saved yet; layer 0 has run
    # its attention block (up_proj is in its MLP)
    held = V * H + not_yet_run + first_round
    assert zero3_head_popped_forward(spec, setup, 10**9, targets) == (2 * held, 0, True)  # 16-bit: 2 bytes


def test_no_head_popped_in_the_forward_when_tied() -> None:
    tied = model_from_config({**CFG, "tie_word_embeddings": True}, "llama-4L-tied")
    lora = build_setup(tied, method="lora", gpus=2, zero=3)
    assert zero3_head_popped_forward(tied, lora, 10**9, frozenset({"q_proj"})) == (0, 0, False)


def test_qlora_walks_the_packed_weights() -> None:
    # 4-bit linears partitioned as packed uint8 codes, one byte a trace element: q, k, v, o H^2 / 2 =
    # 8,388,608 each, gate, up, down H F / 2 = 33,554,432; a layer p = 134,217,728; the embedding and
    # the head V H elements of 2 bytes. Kept from forward to backward: (1e9 - V H) / (2 p) rounds up to
    # 2 layers. A bucket of 1e9:
    # - the first fetch pops E, layers 0-2, layer 3's q..o and gate: 1,006,632,960 elements, one round
    #   (its flat buffer kept until layer 3's gate is fetched), 2 V H + 3 p + 4 q + g bytes
    # - the embedding released (469,762,048), the rotary module's fetch pops 530,237,952 or more: layer 3's
    #   up, down and the head, one round: 3 p + 4 q + g + 2 g + 2 V H bytes gathered, the head among them
    # - layer 0's q_proj waits for the first round: its flat buffer beside the copies until layer 3's gate
    # - each 4-bit linear's forward dequantizes its weight beside them (bitsandbytes dequantize_4bit): H F
    #   elements of 2 bytes for gate, with double quantization the fp32 absmax of its H F / 64 blocks,
    #   138,412,032 bytes; q's H^2 weight only 34,603,008. Layers 0 and 1 are released after their
    #   forward: at layer 0's gate its q, k, v, o (4 q bytes) are gone, the larger weight dequantized is
    #   the most: 3,258,974,208 bytes (at q: 3,188,719,616)
    q, g = H * H // 2, H * F // 2
    p = 4 * q + 3 * g
    first_round = 2 * V * H + 3 * p + 4 * q + g
    gathered = 3 * p + 4 * q + 3 * g + 2 * V * H
    spec = model_from_config(CFG, "llama-4L-untied")
    setup = build_setup(spec, method="qlora", gpus=2, zero=3, gradient_checkpointing=False)
    assert setup.quant_bits == 4
    assert zero3_head_popped_forward(spec, setup, 10**9, frozenset({"q_proj", "v_proj"})) == (
        gathered + first_round - 4 * q + 2 * H * F + 4 * H * F // 64, 0, True)


def test_a_head_over_the_live_limit_pops_beside_the_dequantized_weight() -> None:
    # Llama-3.1-405B's head, V' H' = 128256 x 16384 = 2,101,346,304 elements, is over
    # stage3_max_live_parameters (1e9): the prefetch loop (``numel_prefetching < max_params_to_prefetch``)
    # still pops it whole as its overshoot once releases bring n_available under the limit. Without
    # double quantization the dequantized weight is the whole weight in the compute dtype (fp32 run: 4
    # bytes); the run with it holds also the fp32 absmax of its H' F' / 64 blocks, F' = 53248:
    # 4 x 16384 x 53248 / 64 = 54,525,952 bytes more, at the same linear (layer 1's up_proj, in the
    # simulation 8016 MiB head + 3328 MiB dequantized up_proj + its 52 MiB absmax)
    big = dict(model_type="llama", hidden_size=16384, num_hidden_layers=2, num_attention_heads=128,
               num_key_value_heads=8, intermediate_size=53248, vocab_size=128256, tie_word_embeddings=False)
    spec = model_from_config(big, "llama-405b-2L")
    kw = dict(method="qlora", gpus=2, zero=3, gradient_checkpointing=False, precision="fp32")
    plain = zero3_head_popped_forward(spec, build_setup(spec, double_quant=False, **kw), 10**9,
                                      frozenset({"up_proj"}), compute=4)
    nested = zero3_head_popped_forward(spec, build_setup(spec, double_quant=True, **kw), 10**9,
                                       frozenset({"up_proj"}), compute=4)
    assert plain[0] > 128256 * 16384 * 4 + 16384 * 53248 * 4
    assert nested[0] - plain[0] == 4 * 16384 * 53248 // 64


def test_partitioned_adapter_matrices_are_weights_of_the_walk() -> None:
    # the same model, LoRA of rank 64 on down_proj: its lora_A (64 x 16384 = x = 1,048,576) and lora_B
    # (4096 x 64 = y = 262,144) are over stage3_param_persistence_threshold, partitioned: the trace holds
    # per layer q k v o gate up, down's lora_A (an external parameter of the wrapper, fetched with it),
    # down, lora_B; a layer P' = 4a + 3b + x + y = 269,746,176. The adapters stay gathered.
    # - the first fetch pops E, layer 0, layer 1's q..up: 1,007,943,680, a round kept as its flat buffer
    #   until layer 1's up is fetched; the embedding released (471,072,768), the rotary module's fetch
    #   pops 528,927,232 or more: layer 1's down.A, down, down.B, layer 2, layer 3's q..up (539,492,352)
    # - layer 0's q released (993,787,904); k's fetch pops layer 3's down.A and down; k, v, o, gate
    #   released: 944,504,832; up's fetch pops layer 3's down.B and the head, one round: the head and the
    #   weights not yet run, 2b + x + y + 3P' + V H = 1,481,637,888, beside the first round's flat buffer
    a, b, x, y = H * H, H * F, 64 * F, H * 64
    p = 4 * a + 3 * b + x + y
    first_round = V * H + p + 4 * a + 2 * b
    spec = model_from_config(CFG, "llama-4L-untied")
    setup = build_setup(spec, method="lora", rank=64, gpus=2, zero=3, gradient_checkpointing=False)
    assert zero3_head_popped_forward(spec, setup, 10**9, frozenset({"down_proj"})) == (
        2 * (2 * b + x + y + 3 * p + V * H + first_round), 0, True)


def test_the_running_layer_keeps_its_attention_block_at_an_mlp_linear() -> None:
    # At the head-popped linear the layers below have saved all their activations; the running layer,
    # when that linear is in its MLP block (transformers' decoder layer runs ``self_attn`` and
    # ``post_attention_layernorm`` before ``mlp``), has saved everything but its MLP block's share:
    # top_layer_bytes - mlp_saved_bytes. Checkpointed, a layer saves nothing of its own until its
    # backward recomputes it, but its code still holds its input and the MLP's input projections'
    # outputs (zero3_head_pop_running.py). (simulate, Llama-3.1-405B, 2 layers, QLoRA on q and v,
    # 2 x 512 tokens, bf16: at layer 1's up_proj, layer 1's attention block 0.24e9 bytes beside layer
    # 0's 0.60e9.)
    spec = model_from_config(CFG, "llama-4L-untied")
    for checkpointed in (False, True):
        run = resolve_run(spec, build_setup(spec, method="qlora", gpus=2, zero=3, batch=2, seq=512,
                                            gradient_checkpointing=checkpointed))
        statics = memory_statics(run)
        acts = saved_at(statics.acts, 2, 512)
        logits = logits_plan(1024, statics.vocab, statics.logit_bytes, run.loss, 512, statics.hidden,
                             statics.softmax_keeps_input, statics.softcap, statics.upcast)
        totals = []
        for past_attention in (False, True):
            rows: dict = {}
            popped = replace(statics, gathered_head_popped=(10**9, 1, past_attention))
            gathered_forward_rows(rows, run, popped, acts, logits, 0, 0, 0)
            totals.append(sum(rows["forward_head_popped"]))
        running = (checkpointed_mlp_in_flight(run, 1024) if checkpointed
                   else acts.top_layer_bytes - acts.mlp_saved_bytes)
        assert running >= 0 and totals[1] - totals[0] == running
        assert checkpointed or running > 0


def test_a_freeze_runs_tied_head_is_popped_once_the_embedding_is_released() -> None:
    # gemma-7b (h 3072, 16 heads of 256, f 24576, vocab 256000, tied) at 4 layers, the top 2 trained,
    # without checkpointing, over 4 GPUs, rounds of 5e7. q, k, v, o 12,582,912 each, gate, up, down
    # 75,497,472 each: a layer's linears 276,824,064; E = 786,432,000. The tied head's forward, E's next
    # use, lies 4 layers (1.107e9 > 1e9) away: E is released after its forward; layers 0 and 1 (frozen,
    # below the lowest trained one, where the backward stops) after each linear's. Fetches pop: the root
    # [E], the model [q k v o]0, the embedding [gate]0 (n_available 912.3e6), then E released (125.8e6);
    # rotary [up]0, layer 0 [down]0, its norm [qkvo]1, its attention [gate]1, q0 [up]1 (q0 released),
    # k0 [down]1, v0 [qkvo]2, o0 [gate]2, the post-attention norm [up]2, the MLP [down]2, gate0 [qkvo]3,
    # up0 [gate]3, down0 [up]3 (layer 0 released as it goes: 755.0e6), layer 1 [down]3 (830.5e6), its
    # norm the head's E (min(1e9 - 830.5e6, 5e7) > 0): 786,432,000 + 3 x 276,824,064 = 1,616,904,192
    # gathered at layer 1's q_proj, beside the [qkvo]1 round's flat buffer (q_proj is not its last): in
    # bf16 2 x (1,616,904,192 + 50,331,648) = 3,334,471,680 bytes; layer 0's forward ran before it, the
    # linear in the attention block (simulate: qrec r195, 3.3345e9 bytes gathered at layer 1's q_proj)
    cfg = dict(model_type="gemma", hidden_size=3072, num_hidden_layers=4, num_attention_heads=16,
               num_key_value_heads=16, head_dim=256, intermediate_size=24576, vocab_size=256000,
               tie_word_embeddings=True)
    spec = model_from_config(cfg, "gemma-4L")
    setup = build_setup(spec, method="freeze", gpus=4, zero=3, precision="bf16", offload="all")
    run = resolve_run(spec, setup)
    assert zero3_head_popped_forward(run.model, setup, 50_000_000, frozenset()) == (3_334_471_680, 1, False)
    # at 2 layers the head's forward is 553.7e6 elements after E's: E stays gathered, no pop of its own
    short = model_from_config({**cfg, "num_hidden_layers": 2}, "gemma-2L")
    kept = build_setup(short, method="freeze", gpus=4, zero=3, precision="bf16", offload="all")
    popped = zero3_head_popped_forward(resolve_run(short, kept).model, kept, 50_000_000, frozenset())
    assert popped == (0, 0, False)
