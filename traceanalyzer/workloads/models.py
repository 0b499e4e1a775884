"""Small models: big enough for several DDP buckets, small enough for 4 ranks on 2 cores."""

from __future__ import annotations

import torch
from torch import nn

BATCH = 32
# mlp: ~0.8 M params (~3.3 MB of fp32 grads) -> several 1 MB buckets
MLP_IN, MLP_HIDDEN, MLP_LAYERS, CLASSES = 64, 512, 4, 10
# transformer: a 2-layer encoder over short sequences
TF_DIM, TF_HEADS, TF_LAYERS, TF_SEQ = 64, 4, 2, 16


def build(name: str) -> nn.Module:
    if name == "mlp":
        layers, width = [], MLP_IN
        for _ in range(MLP_LAYERS):
            layers += [nn.Linear(width, MLP_HIDDEN), nn.ReLU()]
            width = MLP_HIDDEN
        return nn.Sequential(*layers, nn.Linear(width, CLASSES))
    if name == "transformer":
        return TinyTransformer()
    raise ValueError(f"unknown model {name!r}")


class TinyTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(TF_DIM, TF_HEADS, dim_feedforward=4 * TF_DIM,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, TF_LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(TF_DIM, CLASSES)

    def forward(self, x):
        return self.head(self.encoder(x).mean(dim=1))


def batch(name: str, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic (inputs, labels); each rank passes its own generator, so data differs per rank."""
    shape = (BATCH, MLP_IN) if name == "mlp" else (BATCH, TF_SEQ, TF_DIM)
    x = torch.randn(shape, generator=generator)
    y = torch.randint(0, CLASSES, (BATCH,), generator=generator)
    return x, y
