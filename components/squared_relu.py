"""Squared ReLU feed-forward: W2 relu(W1 x)^2 (So et al. 2021, "Primer: Searching for Efficient
Transformers for Language Modeling", sec. 3: the activation relu(x)^2). A worked example of a
user's component (docs/components.md): use it as ``ffn: components.squared_relu:SquaredReLU``.
(B, T, C) -> (B, T, C); hidden width ``cfg.ffn_hidden_size`` (4 C by default), biases per
``cfg.bias``, as the built-in two-matrix FFN."""

import torch.nn as nn
import torch.nn.functional as F


class SquaredReLU(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.ffn_hidden_size, bias=cfg.bias)
        self.down = nn.Linear(cfg.ffn_hidden_size, cfg.d_model, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.drop(self.down(F.relu(self.up(x)).square()))
