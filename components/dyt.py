"""Dynamic Tanh in place of a norm: DyT(x) = gamma * tanh(alpha x) + beta (Zhu et al. 2025,
"Transformers without Normalization", eq. 1), alpha one learnable scalar (initial 0.5, their
default alpha_0), gamma and beta per channel (ones and zeros). A worked example of a user's
component (docs/components.md): use it as ``norm: components.dyt:DyT``. (..., C) -> (..., C),
each position on its own: no statistics over tokens, so it cannot see the future."""

import torch
import torch.nn as nn

ALPHA_0 = 0.5  # Zhu et al. 2025, sec. 4: the initial alpha for non-LLM models


class DyT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), ALPHA_0))
        self.weight = nn.Parameter(torch.ones(cfg.d_model))
        self.bias = nn.Parameter(torch.zeros(cfg.d_model))

    def forward(self, x):
        return torch.tanh(self.alpha * x) * self.weight + self.bias
