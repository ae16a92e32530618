"""ZeRO-3's coordinator replayed on sizes, counted by hand from DeepSpeed 0.19.8's
``PartitionedParameterCoordinator`` (estimator/wrappers/zero3_replay.py, zero3_module_trace.py)."""

from __future__ import annotations

from tuneplan.api import build_setup
from tuneplan.estimator.run import resolve_run
from tuneplan.estimator.wrappers.zero3_module_trace import step_events, zero3_replayed_gathered
from tuneplan.estimator.wrappers.zero3_replay import Coordinator, Module, Param, replay
from tuneplan.specs.model import model_from_config


def test_the_prefetcher_pops_available_entries_uncounted_and_the_next_one_alone() -> None:
    # modules fetched in the order m0 [a 6e8], m1 [b 3e8], m2 [c 2e8], m3 [a], m4 [d 9e8]; M = 1e9 live
    # elements, a 5e7 bucket, a reuse distance of 1e9 elements.
    # m0: a gathered (6e8), a popped off the queue; a round under min(1e9 - 6e8, 5e7): b, 3e8 -> 9e8.
    # release m0 (step 1): a is used again at step 3, the modules before it from step 1 hold b + c = 5e8
    # < 1e9: kept. m1: b already popped (its use recorded at step 1, not before it): nothing popped for
    # it; a round under min(1e8, 5e7): c -> 1.1e9. release m1: b has no later use -> 8e8.
    # m2: a round under min(2e8, 5e7): a (AVAILABLE, popped uncounted), then d, 9e8, alone -> 1.7e9.
    a, b, c, d = Param(600_000_000, 1), Param(300_000_000, 1), Param(200_000_000, 1), Param(900_000_000, 1)
    m0, m1, m2, m3, m4 = Module([a]), Module([b]), Module([c]), Module([a]), Module([d])
    events = [("fetch", m0, "F"), ("release", m0, "F"), ("fetch", m1, "F"), ("release", m1, "F"),
              ("fetch", m2, "F"), ("release", m2, "F"), ("fetch", m3, "F"), ("fetch", m4, "F")]
    counts = [n for n, _ in replay(events, 50_000_000)]
    assert counts[:5] == [900_000_000, 900_000_000, 1_100_000_000, 800_000_000, 1_700_000_000]


def test_a_coalesced_rounds_flat_buffer_is_held_until_its_last_parameter_is_fetched() -> None:
    # m0 [a 6e8], m1 [b 3e7], m2 [c 4e7], one byte an element, a 5e7 bucket. m0 gathers a alone (its own
    # buffer, 6e8) and pops [b, c] (3e7 < 5e7, then 7e7): one flat buffer of 7e7 -> 6.7e8. a has no later
    # use: released -> 7e7. m1 waits on b: AllGatherCoalescedHandle.wait copies b and c out of the flat
    # buffer, still filed under c -> 1.4e8. b released -> 1.1e8. m2 takes c's entry off the inflight
    # registry: the flat buffer goes -> 4e7.
    a, b, c = Param(600_000_000, 1), Param(30_000_000, 1), Param(40_000_000, 1)
    m0, m1, m2 = Module([a]), Module([b]), Module([c])
    events = [("fetch", m0, "F"), ("release", m0, "F"), ("fetch", m1, "F"), ("release", m1, "F"),
              ("fetch", m2, "F")]
    assert [g for _, g in replay(events, 50_000_000)] == [670_000_000, 70_000_000, 140_000_000, 110_000_000,
                                                           40_000_000]


def test_a_recomputed_frozen_weight_waits_for_the_backward_module_running() -> None:
    # update_recompute_parameters: the recompute's fetch of w files it under the MLP whose backward runs,
    # active there; w's own release leaves it gathered (2e8), the MLP's release frees it.
    w = Param(200_000_000, 1)
    mlp, linear = Module(), Module([w])
    c = Coordinator([mlp, linear], 0)
    c.fetch(mlp, "B")
    c.fetch(linear, "R")
    c.release(linear, "R")
    assert c.n_available == 200_000_000
    c.release(mlp, "B")
    assert c.n_available == 0


def test_the_embedding_is_popped_alone_in_the_top_layers_backward() -> None:
    # Llama-3.1-70B over 3 layers, QLoRA fp4 rank 16 on q/v with checkpointing, a 2-label head, 4 GPUs in
    # bf16. Packed codes (b/8 = 1/2 a weight, one byte each): q / o 8192^2 / 2 = 33,554,432, k / v
    # 1024 x 8192 / 2 = 4,194,304, gate / up / down 28672 x 8192 / 2 = 117,440,512: 427,819,008 a layer;
    # its LoRA matrices over the 1e5 persistence threshold: q's lora_A / lora_B and v's lora_A, 131,072
    # each (v's lora_B 16,384, the norms and the 16,384-element head persistent). Embedding 128256 x 8192
    # = 1,050,673,152 elements.
    # The second step's forward prefetcher runs ahead and keeps layers 0 and 1 (their uses recorded); at
    # the top layer's MLP backward its recompute-fetched weights are released with the MLP, the count
    # drops under M = 1e9, a round pops layer 0's up_proj, and at the attention's fetch the queue holds
    # only the lower layers' AVAILABLE entries before the embedding: it is popped alone. Gathered then:
    # layers 0 and 1 with their LoRA matrices, 2 x (427,819,008 + 3 x 131,072), the top layer's LoRA
    # matrices 3 x 131,072 and the embedding: 1,907,490,816 elements (the simulation's coordinator count
    # at layer 2's o_proj), in bytes 2 x (427,819,008 + 3 x 262,144) + 3 x 262,144 + 2 x 1,050,673,152.
    cfg = dict(model_type="llama", hidden_size=8192, intermediate_size=28672, num_hidden_layers=3,
               num_attention_heads=64, num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False,
               rope_theta=500000.0)
    spec = model_from_config(cfg, "llama-3.1-70b-3L")
    setup = build_setup(spec, method="qlora", precision="bf16-mixed", gpus=4, zero=3, rank=16,
                        targets="q_proj,v_proj", gradient_checkpointing=True, quant_type="fp4", num_labels=2,
                        offload="optimizer")
    run = resolve_run(spec, setup)
    assert run.dtypes.adapter == 2 and run.dtypes.non_block == 2
    events, top = step_events(run)
    counts = [n for n, _ in replay(events, 50_000_000)]
    assert 2 * (427_819_008 + 3 * 131_072) + 3 * 131_072 + 1_050_673_152 == 1_907_490_816
    assert 1_907_490_816 in counts[top.start:top.stop]
    assert zero3_replayed_gathered(run, 50_000_000).top_backward == (
        2 * (427_819_008 + 3 * 262_144) + 3 * 262_144 + 2 * 1_050_673_152)


def test_the_lora_matrices_count_toward_max_live_at_the_loss() -> None:
    # DeepSeek-R1-Distill-Llama-8B over 4 layers, QLoRA nf4 rank 128 on every linear with checkpointing
    # over 2 GPUs in fp16-mixed. Packed codes: q / o 4096^2 / 2 = 8,388,608, k / v 1024 x 4096 / 2 =
    # 2,097,152, gate / up / down 14336 x 4096 / 2 = 29,360,128: 109,051,904 a layer, 436,207,616 in all.
    # LoRA matrices (all over 1e5, 16-bit): q 2 x 524,288, k / v 524,288 + 131,072, o 2 x 524,288,
    # gate / up 524,288 + 1,835,008, down 1,835,008 + 524,288: 10,485,760 a layer, 41,943,040 in all.
    # Head 128256 x 4096 = 525,336,576. The forward's prefetcher pops everything but the embedding
    # (released after its forward, its backward use queued last): 1,003,487,232 elements >= 1e9 once the
    # head is popped, so the embedding is never reached (without the LoRA matrices 961,544,192 < 1e9
    # would let it in). At the loss: the codes, the LoRA matrices and the head in 2 bytes.
    cfg = dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=4,
               num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False,
               rope_theta=500000.0)
    spec = model_from_config(cfg, "r1-distill-llama-8b-4L")
    setup = build_setup(spec, method="qlora", precision="fp16-mixed", gpus=2, zero=3, rank=128,
                        targets="all-linear", gradient_checkpointing=True, quant_type="nf4",
                        double_quant=True, offload="optimizer")
    run = resolve_run(spec, setup)
    assert run.dtypes.adapter == 2 and run.dtypes.non_block == 2
    assert 436_207_616 + 41_943_040 + 525_336_576 == 1_003_487_232
    replayed = zero3_replayed_gathered(run, 50_000_000)
    assert replayed is not None
    assert replayed.at_loss == 436_207_616 + 2 * 41_943_040 + 2 * 525_336_576


def test_a_targeted_last_linear_is_recomputed_and_the_embedding_released() -> None:
    # Mistral-7B-v0.2 over 3 layers, QLoRA fp4 rank 64 on the MLP with checkpointing and a 1-label head,
    # 4 GPUs. A targeted down_proj's lora_B saves its input: the checkpoint's recompute runs the whole layer.
    # A layer's fetches in one pass, elements (lora_A listed at its wrapper and at itself): attention
    # 2 x 8,388,608 + 2 x 2,097,152 = 20,971,520; gate / up 262,144 + 29,360,128 + 262,144 + 917,504 =
    # 30,801,920 each; down 917,504 + 29,360,128 + 917,504 + 262,144 = 31,457,280; norms 2 x 4,096:
    # 114,040,832. Between the embedding's forward and its backward use: the forward, the recompute and
    # the backward of 3 layers, the final norm's and the head's (4,096 each) two fetches:
    # 9 x 114,040,832 + 4 x 4,096 = 1,026,383,872 >= 1e9, so __params_to_release frees the embedding
    # (32000 x 4096 = 131,072,000) after its forward (the simulation's coordinator: 2.2492e8 after it).
    cfg = dict(model_type="mistral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=3,
               num_attention_heads=32, num_key_value_heads=8, vocab_size=32000, tie_word_embeddings=False,
               rope_theta=1000000.0)
    spec = model_from_config(cfg, "mistral-7b-v0.2-3L")
    setup = build_setup(spec, method="qlora", precision="fp16", gpus=4, zero=3, rank=64, targets="mlp",
                        gradient_checkpointing=True, quant_type="fp4", num_labels=1)
    run = resolve_run(spec, setup)
    events, _ = step_events(run)
    order = [m for action, m, _ in events if action == "fetch"]
    embed = [i for i, m in enumerate(order) if [p.numel for p in m.params] == [131_072_000]]
    assert sum(p.numel for m in order[embed[0] + 1:embed[1]] for p in m.params) == 1_026_383_872
    counts = [n for n, _ in replay(events, 50_000_000)]
    at = events.index(("release", order[embed[0]], "F"))
    assert counts[at - 1] - counts[at] == 131_072_000


def test_a_leaf_module_adds_nothing_to_the_walk_of_a_module_with_direct_parameters() -> None:
    # m0 [a 1e8], m1 a leaf module (its 6e8-element s under it), m2 [b 5e8], m3 [a]; D = 1e9.
    # __params_to_release(m0) walks iter_params(module, recurse=False): m1 has no direct parameter (0),
    # m2 5e8, then m3 holds a: reused within 5e8 < 1e9, kept. Counting m1's 6e8 would stop the walk at
    # 1.1e9 before m3 and free a. Every fetch pops nothing (the bucket is 1 element: a round pops the next
    # entry; m0 pops s, m1 pops b, m2 pops a, AVAILABLE): after m0's release 1e8 + 6e8 = 7e8 stay.
    a, s, b = Param(100_000_000, 1), Param(600_000_000, 1), Param(500_000_000, 1)
    m0, m1, m2, m3 = Module([a]), Module([s], leaf=True), Module([b]), Module([a])
    events = [("fetch", m0, "F"), ("release", m0, "F"), ("fetch", m1, "F"), ("release", m1, "F"),
              ("fetch", m2, "F"), ("release", m2, "F"), ("fetch", m3, "F")]
    counts = [n for n, _ in replay(events, 1)]
    assert counts[1] == 700_000_000


def test_a_leaf_modules_release_walks_every_module_recursively() -> None:
    # m1 a leaf module [s 6e8], m2 [c 3e8], m3 a container of both (no direct parameter, tree [s, c]).
    # __params_to_release(m1) walks iter_params(module, recurse=True) since m1 is a leaf: m2's 3e8, then
    # m3 (3e8 < 1e9 walked), whose tree holds s: kept. The walk of a non-leaf release would see nothing
    # in m3. m1's fetch gathers s and pops c (a one-element bucket): 9e8, kept after m1's release.
    s, c = Param(600_000_000, 1), Param(300_000_000, 1)
    m1, m2, m3 = Module([s], leaf=True), Module([c]), Module(tree=[s, c])
    events = [("fetch", m1, "F"), ("release", m1, "F"), ("fetch", m2, "F"), ("fetch", m3, "F")]
    assert [n for n, _ in replay(events, 1)][:2] == [900_000_000, 900_000_000]
    # without the container, s has no later use: freed
    events = [("fetch", m1, "F"), ("release", m1, "F"), ("fetch", m2, "F")]
    assert [n for n, _ in replay(events, 1)][:2] == [900_000_000, 300_000_000]


def test_leaf_moe_layers_keep_the_attention_and_the_top_block_to_the_loss() -> None:
    # Qwen3-30B-A3B over 4 layers, LoRA rank 4 on q/v with checkpointing over 4 GPUs in bf16-mixed: the
    # Qwen3-MoE block is a ZeRO-3 leaf module (DeepSpeed's DEFAULT_LEAF_MODULE_CLASSES). Elements:
    # embedding = head = 151936 x 2048 = 311,164,928; a layer's attention q 2048 x 4096 = 8,388,608,
    # k / v 2048 x 512 = 1,048,576, o 8,388,608: 18,874,368; the block's experts gate_up_proj
    # 128 x 1536 x 2048 = 402,653,184, down_proj 128 x 2048 x 768 = 201,326,592, router 128 x 2048 =
    # 262,144 (the LoRA matrices, norms under 1e5: persistent).
    # A non-leaf module's release walks direct parameters only, a leaf block adds nothing: between an
    # attention weight's forward and its recompute, and between the embedding's forward and its backward,
    # the trace holds the attention thrice a layer (forward, recompute, backward: 12 x 18,874,368) and the
    # head twice, < 1e9: all kept. A block's release walks recursively: below the top layer the next
    # layer's module (6.2e8) and the rest pass 1e9 before its own layer's backward: freed; the top block
    # meets PeftModel's backward fetch, which holds it, after the head alone (3.1e8): kept. At the loss
    # 1,302,069,248 elements >= 1e9: layer 2's gate_up_proj is not popped (the simulation's coordinator:
    # 1.302e9). In 2 bytes: 2,604,138,496.
    from tuneplan.catalog.models import resolve_model

    base = resolve_model("Qwen/Qwen3-30B-A3B", allow_network=False)
    spec = model_from_config(dict(base.config, num_hidden_layers=4), "qwen3-30b-a3b-4L")
    setup = build_setup(spec, method="lora", precision="bf16-mixed", gpus=4, zero=3, rank=4,
                        targets="q_proj,v_proj", gradient_checkpointing=True, offload="optimizer")
    run = resolve_run(spec, setup)
    total = 2 * 311_164_928 + 4 * 18_874_368 + 402_653_184 + 201_326_592 + 262_144
    assert total == 1_302_069_248
    replayed = zero3_replayed_gathered(run, 50_000_000)
    assert replayed is not None
    assert replayed.at_loss == 2 * total


def test_the_bottom_layers_moe_block_meets_the_next_layers_round_held_twice() -> None:
    # Qwen3-30B-A3B over 2 layers, QLoRA fp4 rank 128 on q/v in fp32 with checkpointing, optimizer and
    # parameter offload over 4 GPUs (a 5e7 bucket). A layer's entries over 1e5 elements, in trace order
    # (bytes): q codes 2048 x 4096 / 2 = 4,194,304 (1), q lora_A 128 x 2048 = 262,144 (4), lora_B 4096 x
    # 128 = 524,288 (4), k / v codes 524,288 (1), v lora_A 262,144 (4), o codes 4,194,304 (1); the leaf
    # block's experts first: gate_up_proj 402,653,184, down_proj 201,326,592, router 262,144 (4 bytes,
    # never quantized). The wrappers' four fetches pop: the embedding 311,164,928 alone; layer 0 through
    # its gate_up_proj (one round, A = 724,303,872); its down_proj alone (925,630,464); then, A < M, layer
    # 0's router and layer 1 through its gate_up_proj (1,339,031,552). Layer 0's block fetch waits on its
    # router: the last round's copies are made while layer 1's entries keep its flat buffer.
    # Copies: embedding 1,244,659,712; layer 0 codes 9,437,184 + LoRA 4,194,304 + router 1,048,576 +
    # stacks 1,610,612,736 + 805,306,368; layer 1 codes 9,437,184 + LoRA 4,194,304 + gate_up_proj
    # 1,610,612,736: 5,299,503,104. Flat buffer: 1,048,576 + 1,624,244,224 = 1,625,292,800. In all
    # 6,924,795,904 (the simulation: 6.887e9 gathered at layer 0's MoE block, the step's peak).
    from tuneplan.catalog.models import resolve_model
    from tuneplan.estimator.wrappers.zero3_module_trace import zero3_replayed_forward

    base = resolve_model("Qwen/Qwen3-30B-A3B", allow_network=False)
    spec = model_from_config(dict(base.config, num_hidden_layers=2), "qwen3-30b-a3b-2L")
    setup = build_setup(spec, method="qlora", precision="fp32", gpus=4, zero=3, rank=128,
                        targets="q_proj,v_proj", gradient_checkpointing=True, quant_type="fp4",
                        double_quant=False, offload="all")
    run = resolve_run(spec, setup)
    copies = 1_244_659_712 + (9_437_184 + 4_194_304 + 1_048_576 + 1_610_612_736 + 805_306_368) + (
        9_437_184 + 4_194_304 + 1_610_612_736)
    assert copies == 5_299_503_104
    assert zero3_replayed_forward(run, 50_000_000) == copies + 1_625_292_800
