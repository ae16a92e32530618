"""A decoder-shaped toy for the FSDP wrapping tests: embeddings, two layers named in ``_no_split_modules``,
a final norm and an output head, laid out as transformers' *ForCausalLM models are."""

from __future__ import annotations

from torch import nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(5, 5)


class Inner(nn.Module):
    _no_split_modules = ["Block"]

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(7, 5)
        self.layers = nn.ModuleList([Block(), Block()])
        self.norm = nn.LayerNorm(5)


class ToyLM(nn.Module):
    base_model_prefix = "model"

    def __init__(self, tied: bool = False) -> None:
        super().__init__()
        self.model = Inner()
        self.lm_head = nn.Linear(5, 7, bias=False)
        if tied:
            self.lm_head.weight = self.model.embed.weight

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head
