"""Reference GPT written the way seed 000 writes it: a COMPARATOR FOR THE BENCHMARKS ONLY.

Not used by the pipeline. ``bench_throughput.py`` times lmablate's baseline against this
straightforward implementation (Karpathy's "Let's build GPT" MinGPT as seed 000 lists it):

* one fused ``qkv`` Linear, split into k, q, v, heads by view/transpose;
* explicit attention ``q @ k^T * hs**-0.5``, ``masked_fill`` with a registered ``tril`` buffer,
  ``softmax``, ``@ v`` (no fused SDPA kernel);
* learned position table, pre-norm LayerNorm blocks, ReLU feed-forward 4 x d_model,
  final LayerNorm and an LM head.

To make the comparison about the implementation and not about the parameter count, biases follow
``cfg.bias`` everywhere and the LM head has none, exactly like ``lmablate.model.gpt.GPT``'s baseline
(seed 000 drops the FFN/qkv biases and keeps one on the LM head; the FLOPs differ by <0.1%).
:func:`copy_from_lmablate` loads an lmablate baseline's weights, so the benchmark can check that
both compute the same function before timing them.

Also here: :func:`seed_get_batch`, the makemore/nanoGPT batch sampler (a Python loop over the
batch building windows with ``torch.stack``), the reference for lmablate's one-gather sampler.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from lmablate.config.study import ModelConfig


class MultiHeadAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        E, T = cfg.d_model, cfg.context_length
        self.attn = nn.Linear(E, 3 * E, bias=cfg.bias)  # fused k, q, v
        self.register_buffer("tril", torch.tril(torch.ones(T, T)).view(1, 1, T, T))
        self.attn_dropout = nn.Dropout(cfg.dropout)
        self.rsid_dropout = nn.Dropout(cfg.dropout)
        self.proj = nn.Linear(E, E, bias=cfg.bias)
        self.num_heads = cfg.n_heads

    def forward(self, x):
        B, C, E = x.size()  # batch, context, embedding
        NH = self.num_heads
        k, q, v = self.attn(x).split(E, dim=2)  # (B, C, E) each
        k = k.view(B, C, NH, E // NH).transpose(1, 2)  # (B, NH, C, HS)
        q = q.view(B, C, NH, E // NH).transpose(1, 2)
        v = v.view(B, C, NH, E // NH).transpose(1, 2)
        wei = q @ k.transpose(-2, -1) * (E // NH) ** -0.5  # (B, NH, C, C)
        wei = wei.masked_fill(self.tril[:, :, :C, :C] == 0, float("-inf"))
        wei = F.softmax(wei, dim=-1)
        wei = self.attn_dropout(wei)
        out = wei @ v  # (B, NH, C, HS)
        out = out.transpose(1, 2).contiguous().view(B, C, E)
        return self.rsid_dropout(self.proj(out))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        E = cfg.d_model
        self.net = nn.Sequential(
            nn.Linear(E, 4 * E, bias=cfg.bias),
            nn.ReLU(),
            nn.Linear(4 * E, E, bias=cfg.bias),
            nn.Dropout(cfg.dropout),
        )

    def forward(self, x):
        return self.net(x)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.mha = MultiHeadAttention(cfg)
        self.ffwd = FeedForward(cfg)
        self.ln_mha = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.ln_ff = nn.LayerNorm(cfg.d_model, bias=cfg.bias)

    def forward(self, x):
        x = x + self.mha(self.ln_mha(x))  # pre-norm
        x = x + self.ffwd(self.ln_ff(x))
        return x


class MinGPT(nn.Module):
    """Seed 000's MinGPT at the sizes of ``cfg`` (d_model, n_layers, n_heads, context_length,
    vocab_size). Only ``ffn: relu``, ``norm: layernorm``, ``position: learned``, pre-norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        assert cfg.ffn == "relu" and cfg.norm == "layernorm" and cfg.position == "learned"
        assert cfg.norm_placement == "pre" and cfg.n_query_groups == cfg.n_heads
        self.cfg = cfg
        self.token_embedding_table = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.positional_embedding_table = nn.Embedding(cfg.context_length, cfg.d_model)
        self.blocks = nn.Sequential(*[Block(cfg) for _ in range(cfg.n_layers)])
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, idx, targets=None):
        B, C = idx.shape
        tok_emb = self.token_embedding_table(idx)  # (B, C, E)
        pos_emb = self.positional_embedding_table(torch.arange(C, device=idx.device))  # (C, E)
        x = self.blocks(tok_emb + pos_emb)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        B, C, V = logits.shape
        loss = F.cross_entropy(logits.view(B * C, V).float(), targets.reshape(B * C))
        return logits, loss


@torch.no_grad()
def copy_from_lmablate(ref: MinGPT, gpt) -> MinGPT:
    """Load the weights of an lmablate baseline ``GPT`` (same cfg) into ``ref``: its separate
    ``q`` and ``kv`` projections become the fused ``attn`` (k, q, v order). Returns ``ref``."""
    ref.token_embedding_table.weight.copy_(gpt.wte.weight)
    ref.positional_embedding_table.weight.copy_(gpt.position.wpe.weight)
    E = gpt.cfg.d_model
    for rb, gb in zip(ref.blocks, gpt.blocks):
        a = gb.attn
        k_w, v_w = a.kv.weight[:E], a.kv.weight[E:]  # kv rows are (2, nkv, hs) -> k then v
        rb.mha.attn.weight.copy_(torch.cat([k_w, a.q.weight, v_w]))
        if a.q.bias is not None:
            rb.mha.attn.bias.copy_(torch.cat([a.kv.bias[:E], a.q.bias, a.kv.bias[E:]]))
        rb.mha.proj.load_state_dict(a.proj.state_dict())
        rb.ffwd.net[0].load_state_dict(gb.ffn.up.state_dict())
        rb.ffwd.net[2].load_state_dict(gb.ffn.down.state_dict())
        rb.ln_mha.load_state_dict(gb.norm_1.state_dict())
        rb.ln_ff.load_state_dict(gb.norm_2.state_dict())
    ref.ln_f.load_state_dict(gpt.norm_f.state_dict())
    ref.lm_head.load_state_dict(gpt.lm_head.state_dict())
    return ref


def seed_get_batch(data: torch.Tensor, batch_size: int, context_length: int,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """makemore/nanoGPT's sampler, as seed 000 uses it: one Python slice per sequence."""
    ix = torch.randint(len(data) - context_length, (batch_size,))
    x = torch.stack([data[i:i + context_length] for i in ix])
    y = torch.stack([data[i + 1:i + context_length + 1] for i in ix])
    return x.to(device), y.to(device)
