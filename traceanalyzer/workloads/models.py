"""Small models: big enough for several DDP buckets, small enough for 4 ranks on 2 cores."""

from __future__ import annotations

import torch
from torch import nn

BATCH = 32
# mlp: ~0.8 M params (~3.3 MB of fp32 grads) -> several 1 MB buckets
MLP_IN, MLP_HIDDEN, MLP_LAYERS, CLASSES = 64, 512, 4, 10
# transformer: a 2-layer encoder over short sequences
TF_DIM, TF_HEADS, TF_LAYERS, TF_SEQ = 64, 4, 2, 16


def build(name: str, width: int = MLP_HIDDEN, depth: int = MLP_LAYERS) -> nn.Module:
    """The model `name`; `width`/`depth` (mlp only) set the hidden size and the number of hidden
    layers, e.g. width 1024, depth 8: ~7.4 M params (~28 MB of fp32 grads), big enough for the
    DDP bucket size to matter (the default mlp's 3.3 MB fits in one 25 MB bucket)."""
    if name == "mlp":
        layers, w = [], MLP_IN
        for _ in range(depth):
            layers += [nn.Linear(w, width), nn.ReLU()]
            w = width
        return nn.Sequential(*layers, nn.Linear(w, CLASSES))
    if name == "transformer":
        return TinyTransformer()
    raise ValueError(f"unknown model {name!r}")


def _encoder_layer() -> nn.Module:
    return nn.TransformerEncoderLayer(TF_DIM, TF_HEADS, dim_feedforward=4 * TF_DIM,
                                      batch_first=True)


class TinyTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.TransformerEncoder(_encoder_layer(), TF_LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(TF_DIM, CLASSES)

    def forward(self, x):
        return self.head(self.encoder(x).mean(dim=1))


class Head(nn.Module):
    """Mean over the sequence, then classify (the last pipeline stage of the transformer)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(TF_DIM, CLASSES)

    def forward(self, x):
        return self.linear(x.mean(dim=1))


def stage_module(name: str, stage: int, n_stages: int, layers: int) -> nn.Module:
    """Pipeline stage `stage` of `n_stages`: `layers` hidden layers (mlp: Linear+ReLU,
    transformer: encoder layers), plus the input projection on the first stage (mlp)
    and the classifier on the last. Stages pass (rows, MLP_HIDDEN) or (rows, TF_SEQ, TF_DIM)."""
    parts: list[nn.Module] = []
    if name == "mlp":
        width = MLP_IN if stage == 0 else MLP_HIDDEN
        for _ in range(layers):
            parts += [nn.Linear(width, MLP_HIDDEN), nn.ReLU()]
            width = MLP_HIDDEN
        if stage == n_stages - 1:
            parts.append(nn.Linear(MLP_HIDDEN, CLASSES))
    elif name == "transformer":
        parts = [_encoder_layer() for _ in range(layers)]
        if stage == n_stages - 1:
            parts.append(Head())
    else:
        raise ValueError(f"unknown model {name!r}")
    return nn.Sequential(*parts)


def batch(name: str, generator: torch.Generator, rows: int = BATCH,
          seq: int = TF_SEQ) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic (inputs, labels); each rank passes its own generator, so data differs per rank.
    `rows`/`seq` let a workload give one rank more work (batch or sequence-length skew)."""
    shape = (rows, MLP_IN) if name == "mlp" else (rows, seq, TF_DIM)
    x = torch.randn(shape, generator=generator)
    y = torch.randint(0, CLASSES, (rows,), generator=generator)
    return x, y


def skewed_batch(name: str, generator: torch.Generator, factor: float,
                 rows: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch `factor` x the work: more rows for the mlp, longer sequences for the transformer."""
    if name == "mlp":
        return batch(name, generator, rows=max(1, round(rows * factor)))
    return batch(name, generator, rows=rows, seq=max(1, round(TF_SEQ * factor)))
