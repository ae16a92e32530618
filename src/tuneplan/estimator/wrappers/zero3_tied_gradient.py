"""The tied output head's weight gradient that autograd holds through ZeRO-3's layers' backward."""

from __future__ import annotations

from tuneplan.specs.model import ModelSpec
from tuneplan.specs.setup import TrainSetup


def zero3_tied_head_gradient(model: ModelSpec, setup: TrainSetup, compute: int) -> int:
    """Bytes of a trained tied head's weight gradient alive from the head's backward to the token
    embedding's (0 when the head is untied, not trained, or a classifier's).

    The head and the embedding share one parameter, so its ``AccumulateGrad`` node has two inputs; the
    engine (torch/csrc/autograd/engine.cpp ``Engine::evaluate_function``, ``InputBuffer::add``) keeps the
    head's contribution, ``dlogits^T x`` (vocab x hidden in the parameter's dtype), in the node's input
    buffer until the embedding's backward supplies the second, the step's last. ZeRO-3's gradient hook
    (stage3.py ``create_reduce_and_remove_grad_hooks`` -> utils/torch.py ``register_grad_hook``:
    ``register_post_accumulate_grad_hook``) fires only once the node has run, so nothing reduces or frees
    it through the decoder layers' backward:

    .. math:: H = V\\,h\\,b_{compute}

    (the embedding's own backward row already counts both contributions and their sum,
    ``saved_tensors.embedding_backward_at``)."""
    if not model.tied_embeddings or setup.method != "full" or setup.num_labels is not None:
        return 0
    return model.vocab * model.hidden * compute
