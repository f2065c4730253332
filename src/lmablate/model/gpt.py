"""A small GPT whose components are swapped by name: the model every ablation trains.

Read top to bottom: norms, feed-forwards, position schemes, attention (with a KV cache), blocks,
then :class:`GPT` and the helpers the pipeline calls (parameter/FLOP counts, parameter matching,
a causality pre-flight check). The strings in :class:`~lmablate.config.study.ModelConfig` are
resolved through the explicit registries ``NORMS``, ``FFNS``, ``POSITIONS`` and ``PLACEMENTS``,
keyed by exactly ``config.py``'s choice tuples, or to a user's own class of the project's
``components/`` folder (:func:`resolve`, :mod:`lmablate.model.components`).

Shapes: B batch, T tokens in this call, C = d_model, nh query heads, nkv key/value heads
(``cfg.n_query_groups``), hs = head_dim = C / nh. Losses are in nats.
"""

from __future__ import annotations

import math
import threading
from functools import lru_cache, partial

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from lmablate.config.study import ModelConfig
from lmablate.model.components import load_component

def resolve(registry: dict, name: str):
    """The class (or factory) ``name`` stands for: a built-in of ``registry``, else a user's
    component, ``components.<module>:<Class>`` (:func:`lmablate.model.components.load_component`).

    Raises:
        ComponentError: a component that cannot be loaded.
    """
    return registry[name] if name in registry else load_component(name)


# PyTorch's default RNG is process-wide. Code that seeds it and draws from it (initial weights,
# the causality check) holds this lock, so that runs trained in threads of one process
# (lmablate.execution.parallel) each get the weights their seed gives.
GLOBAL_RNG_LOCK = threading.RLock()

# ---------------------------------------------------------------------------------------- norms


class LayerNorm(nn.LayerNorm):
    """LayerNorm over the last dim of (..., C) (Ba et al. 2016); a bias only if ``cfg.bias``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias)


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019, eq. 4): x / sqrt(mean(x^2) + eps) * g.

    Each position is normalised over its own last dimension only; the gain g has shape (C,).
    No re-centring and no bias, as in the paper. Input and output (..., C).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.eps = cfg.norm_eps
        self.weight = nn.Parameter(torch.ones(cfg.d_model))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()  # the mean of squares in fp32, so bf16 activations do not overflow it
        xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


NORMS = {"layernorm": LayerNorm, "rmsnorm": RMSNorm}

# -------------------------------------------------------------------------------- feed-forwards

gelu_tanh = partial(F.gelu, approximate="tanh")  # GPT-2's GELU (Hendrycks & Gimpel 2016, sec. 2)


class MLP(nn.Module):
    """Two-matrix feed-forward W2(act(W1 x)) (Vaswani et al. 2017, eq. 2). (B, T, C) -> (B, T, C).

    Hidden width ``cfg.ffn_hidden_size`` (4 C by default); biases per ``cfg.bias``.
    """

    def __init__(self, cfg: ModelConfig, activation):
        super().__init__()
        self.act = activation
        self.up = nn.Linear(cfg.d_model, cfg.ffn_hidden_size, bias=cfg.bias)
        self.down = nn.Linear(cfg.ffn_hidden_size, cfg.d_model, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.down(self.act(self.up(x))))


class GatedMLP(nn.Module):
    """GLU-family feed-forward W2(act(x W) * (x V)) (Shazeer 2020, eqs. 5-6). (B,T,C) -> (B,T,C).

    Three matrices, so the default hidden width is 2/3 * 4 C rounded up to a multiple of
    ``cfg.ffn_multiple_of`` (see ``ModelConfig.ffn_hidden_size``) to keep the parameter count of
    :class:`MLP`. ``gate`` computes x W, ``up`` computes x V.
    """

    def __init__(self, cfg: ModelConfig, activation):
        super().__init__()
        self.act = activation
        self.gate = nn.Linear(cfg.d_model, cfg.ffn_hidden_size, bias=cfg.bias)
        self.up = nn.Linear(cfg.d_model, cfg.ffn_hidden_size, bias=cfg.bias)
        self.down = nn.Linear(cfg.ffn_hidden_size, cfg.d_model, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.down(self.act(self.gate(x)) * self.up(x)))


# GEGLU uses the same tanh-approximate GELU as the plain GELU MLP, so the two differ only in gating.
FFNS = {
    "relu": partial(MLP, activation=F.relu),
    "gelu": partial(MLP, activation=gelu_tanh),
    "swiglu": partial(GatedMLP, activation=F.silu),
    "geglu": partial(GatedMLP, activation=gelu_tanh),
    "reglu": partial(GatedMLP, activation=F.relu),
    "glu": partial(GatedMLP, activation=torch.sigmoid),
}

# ---------------------------------------------------------------------------------- positions


def _check_range(pos: int, T: int, rows: int) -> None:
    if pos < 0 or pos + T > rows:
        raise ValueError(f"positions {pos}..{pos + T - 1} are outside the table of "
                         f"context_length={rows} rows")


def _check_start(pos: int) -> None:
    if pos < 0:
        raise ValueError(f"position {pos} is negative")


class Position(nn.Module):
    """Base of the position schemes: three hooks, all no-ops here. A scheme overrides one.

    * ``embed(x (B,T,C), pos) -> (B,T,C)``: add something to the token embeddings
      (``embed_ids(x, idx, pos)`` when the scheme reads the token ids too).
    * ``rotate(q (B,nh,T,hs), k (B,nkv,T,hs), pos) -> (q, k)``: transform queries and keys.
    * ``attn_bias(T_q, T_k, offset) -> (nh, T_q, T_k) or None``: add to attention scores.

    ``pos``/``offset`` is the absolute position of the first of the T tokens (the KV-cache length).

    ``max_positions`` is how many positions the scheme can encode: None for any number (computed
    from the position, so a model trained on ``context_length`` tokens can be run on longer
    sequences to measure length extrapolation, Press et al. 2022), or the size of a trained table.
    """

    max_positions: int | None = None

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.context_length = cfg.context_length

    def embed(self, x: Tensor, pos: int) -> Tensor:
        return x

    def embed_ids(self, x: Tensor, idx: Tensor, pos: int) -> Tensor:
        """``embed`` for a scheme that also reads the token ids ``idx`` (B,T); the model calls
        this one. The default ignores them."""
        return self.embed(x, pos)

    def rotate(self, q: Tensor, k: Tensor, pos: int) -> tuple[Tensor, Tensor]:
        return q, k

    def attn_bias(self, T_q: int, T_k: int, offset: int) -> Tensor | None:
        return None


class NoPosition(Position):
    """NoPE: no position signal at all; order comes from the causal mask alone
    (Haviv et al. 2022; Kazemnejad et al. 2023)."""


class LearnedPosition(Position):
    """Absolute learned table of ``context_length`` rows added to the tokens (GPT-1/GPT-2). It has
    no row for a position past the training context, so it cannot extrapolate.

    Raises:
        ValueError: a position >= context_length.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.max_positions = cfg.context_length
        self.wpe = nn.Embedding(cfg.context_length, cfg.d_model)

    def embed(self, x: Tensor, pos: int) -> Tensor:
        _check_range(pos, x.size(1), self.context_length)
        return x + self.wpe(torch.arange(pos, pos + x.size(1), device=x.device))  # (T, C) broadcast


class SinusoidalPosition(Position):
    """Fixed sinusoids added to the tokens (Vaswani et al. 2017, sec. 3.5):
    PE(p, 2i) = sin(p / 10000^(2i/C)), PE(p, 2i+1) = cos(p / 10000^(2i/C)).

    As in the paper (sec. 3.4, "we multiply those weights by sqrt(d_model)"), the token
    embeddings are multiplied by sqrt(C) before the table is added: x * sqrt(C) + PE. The table
    has RMS 1/sqrt(2) per coordinate; GPT-2's init gives embeddings of std 0.02, which unscaled
    would be drowned by it at the start of training. Only this scheme scales: the baseline's
    learned table and every other scheme see the embeddings as they are.

    Rows past ``context_length`` are computed when asked for, with the same formula and the same
    float32 operations, so they are what a longer table would hold.

    Raises:
        ValueError: a negative position.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        inv_freq = 10000.0 ** (-torch.arange(0, cfg.d_model, 2, dtype=torch.float32) / cfg.d_model)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (C/2,)
        self.register_buffer("pe", self.table(0, cfg.context_length),
                             persistent=False)  # (ctx, C); rebuilt, never trained
        self.scale = math.sqrt(cfg.d_model)  # Vaswani et al. sec. 3.4

    def table(self, start: int, end: int) -> Tensor:
        """PE rows of positions start..end-1: (end - start, C) float32."""
        p = torch.arange(start, end, dtype=torch.float32, device=self.inv_freq.device)[:, None]
        pe = torch.zeros(end - start, 2 * self.inv_freq.numel(), device=self.inv_freq.device)
        pe[:, 0::2] = torch.sin(p * self.inv_freq)
        pe[:, 1::2] = torch.cos(p * self.inv_freq)
        return pe

    def embed(self, x: Tensor, pos: int) -> Tensor:
        T = x.size(1)
        _check_start(pos)
        pe = self.pe[pos:pos + T] if pos + T <= self.context_length else self.table(pos, pos + T)
        return x * self.scale + pe.to(x.dtype)


def _rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate each pair (x_2i, x_2i+1) of (B, h, T, hs) by its angle; cos/sin are (T, hs/2)."""
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]  # (B, h, T, hs/2)
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (B, h, T, hs/2, 2)
    return out.flatten(-2).type_as(x)


class RoPE(Position):
    """Rotary embedding (Su et al. 2021, RoFormer, eq. 34): the pair (2i, 2i+1) of every query and
    key head at position m is rotated by m * theta_i, theta_i = base^(-2i/hs), i = 0..hs/2-1,
    base = ``cfg.rope_base``. Values are never rotated. Scores then depend on positions only
    through n - m (eq. 16). Built from (ctx, hs/2) cos/sin tables, not dense rotation matrices;
    the angles of positions past ``context_length`` are computed when asked for, with the same
    float32 operations, so they are what a longer table would hold.

    Raises:
        ValueError: a negative position.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        theta = cfg.rope_base ** (-torch.arange(0, cfg.head_dim, 2, dtype=torch.float32)
                                  / cfg.head_dim)  # (hs/2,)
        self.register_buffer("theta", theta, persistent=False)
        angles = self.angles(0, cfg.context_length)
        self.register_buffer("cos", angles.cos(), persistent=False)  # (ctx, hs/2)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def angles(self, start: int, end: int) -> Tensor:
        """m * theta_i for positions m = start..end-1: (end - start, hs/2) float32."""
        m = torch.arange(start, end, dtype=torch.float32, device=self.theta.device)
        return torch.outer(m, self.theta)

    def rotate(self, q: Tensor, k: Tensor, pos: int) -> tuple[Tensor, Tensor]:
        T = q.size(2)
        _check_start(pos)
        if pos + T <= self.context_length:
            cos, sin = self.cos[pos:pos + T], self.sin[pos:pos + T]
        else:
            angles = self.angles(pos, pos + T)
            cos, sin = angles.cos(), angles.sin()
        return _rotate_pairs(q, cos, sin), _rotate_pairs(k, cos, sin)


def alibi_slopes(n_heads: int) -> list[float]:
    """ALiBi head slopes (Press et al. 2022, sec. 3): for a power of two n, the geometric sequence
    2^(-8/n), 2^(-16/n), ..., 2^(-8). Otherwise the paper's interpolation: the slopes of the closest
    smaller power of two c, then every other slope of the 2c sequence, n - c of them."""

    def geometric(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if n_heads & (n_heads - 1) == 0:
        return geometric(n_heads)
    closest = 2 ** int(math.floor(math.log2(n_heads)))
    return geometric(closest) + geometric(2 * closest)[0::2][: n_heads - closest]


class ALiBi(Position):
    """Attention with linear biases (Press et al. 2022, sec. 3): no embedding; head h adds
    -slope_h * (i - j) to the score of query i for key j. Works at any length."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.register_buffer("slopes", torch.tensor(alibi_slopes(cfg.n_heads)), persistent=False)

    def attn_bias(self, T_q: int, T_k: int, offset: int) -> Tensor:
        i = torch.arange(offset, offset + T_q, device=self.slopes.device)[:, None]  # (T_q, 1)
        j = torch.arange(T_k, device=self.slopes.device)[None, :]  # (1, T_k)
        return -self.slopes[:, None, None] * (i - j)  # (nh, T_q, T_k); j > i is masked later


# a multiplier per character of a line for the coupled scheme's training offsets (any fixed
# odd constants spread the hash; a line has at most MAX_CONTEXT characters)
_LINE_HASH = 2654435761


def coupled_slots(line_length: int, width: int) -> Tensor:
    """Digit significance carried by each character slot of a line ``$(a op b)=c$`` of fixed
    ``width`` fields, answer reversed: (line_length,) int64, -1 where none.

    Operand slots carry their digit's significance (``width - 1`` for the leftmost); the slot
    that *predicts* answer digit j (``=`` for j = 0, then answer digit j - 1) carries j, so that
    the token emitting a digit sits at that digit's coupled position (Cho et al. 2024, sec. 3).
    """
    W, r = width, torch.arange(line_length)
    sig = torch.full((line_length,), -1, dtype=torch.long)
    for start in (2, 3 + W):  # operand a after "$(", operand b after the operator
        inside = (r >= start) & (r < start + W)
        sig[inside] = W - 1 - (r[inside] - start)
    answer = (r >= 4 + 2 * W) & (r < 4 + 3 * W)  # "=" and the answer's first W - 1 digits
    sig[answer] = r[answer] - (4 + 2 * W)
    return sig


class CoupledPosition(Position):
    """Position coupling (Cho et al. 2024, "Position Coupling: Improving Length Generalization
    of Arithmetic Transformers Using Task Structure"; Abacus embeddings, McLeish et al. 2024,
    are the same idea): a learned table indexed not by position but by digit significance, so
    the digits of equal significance in both operands and the answer share an embedding, and
    the table's row ``1 + offset + significance`` is added to them (row 0 to every other token).

    It knows lmablate's arithmetic lines (``$(a op b)=c$``, fixed-width fields, answer reversed,
    ``cfg.line_length`` characters) and that a window starts at a line (``TokenData.stride``).
    In training each line but a window's first is shifted by an offset in ``0..K-1``
    (K = context_length - width - 1; the papers' random start), a hash of the previous line's
    tokens: deterministic, causal, and independent of the line itself. In evaluation a window's
    line n has offset n x (width + 1) (line 0, where a problem is asked: 0), a function of the
    position alone, so cached decoding equals the full forward and no two lines share a row;
    significances the training operands never had (a longer operand's leading digit) fall on
    rows trained at other offsets. The table has ``context_length`` rows: the learned
    baseline's parameter count. Runs at any length.

    A config not bound to its lines (``line_length`` 0) builds, with the same parameters, so
    that it can be counted; it refuses to run.

    Raises:
        ValueError: a forward of a config without ``line_length``, or one in training mode that
            does not start at position 0.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.line_length = cfg.line_length
        self.width = max(0, (cfg.line_length - 6) // 3)
        self.n_offsets = cfg.context_length - self.width - 1
        self.wce = nn.Embedding(cfg.context_length, cfg.d_model)
        self.register_buffer("slots", coupled_slots(cfg.line_length, self.width),
                             persistent=False)  # (L,)
        weights = torch.tensor([pow(_LINE_HASH, i + 1, 2**31) for i in range(cfg.line_length)],
                               dtype=torch.long)
        self.register_buffer("hash_weights", weights, persistent=False)  # (L,) int64

    def line_offsets(self, idx: Tensor) -> Tensor:
        """(B, T//L + 1) int64: the training offset of each line of windows ``idx`` (B,T)
        starting at a line; line 0's is 0, line n's a hash of line n-1's tokens."""
        B, L = idx.size(0), self.line_length
        full = idx[:, :idx.size(1) // L * L].reshape(B, -1, L).long()  # (B, lines, L)
        h = (full * self.hash_weights).sum(-1) % self.n_offsets  # (B, lines)
        return torch.cat([h.new_zeros(B, 1), h], dim=1)

    def ids(self, idx: Tensor, pos: int) -> Tensor:
        """Table rows of tokens ``idx`` (B,T) whose first is at absolute position ``pos``:
        (B, T) int64."""
        if not self.line_length:
            raise ValueError("position coupled needs cfg.line_length: the model must be bound "
                             "to an arithmetic dataset (variants.resolve_model_config)")
        _check_start(pos)
        t = torch.arange(pos, pos + idx.size(1), device=idx.device)
        sig = self.slots[t % self.line_length]  # (T,)
        if not self.training:  # line n at n x (width + 1): no row shared with an earlier line
            offset = (t // self.line_length) * (self.width + 1) % self.n_offsets  # (T,)
            return torch.where(sig >= 0, 1 + offset + sig, 0).expand(idx.size(0), -1)
        if pos != 0:
            raise ValueError(f"coupled positions train on windows from position 0, not {pos}")
        offset = self.line_offsets(idx)[:, t // self.line_length]  # (B, T)
        return torch.where(sig >= 0, 1 + offset + sig, 0)

    def embed_ids(self, x: Tensor, idx: Tensor, pos: int) -> Tensor:
        return x + self.wce(self.ids(idx, pos))


POSITIONS = {
    "learned": LearnedPosition,
    "sinusoidal": SinusoidalPosition,
    "rope": RoPE,
    "alibi": ALiBi,
    "none": NoPosition,
    "coupled": CoupledPosition,
}

# ---------------------------------------------------------------------------------- attention


class KVCache:
    """Keys and values of the tokens seen so far, for incremental decoding.

    ``k``/``v`` are preallocated (n_layers, B, nkv, max_len, hs); ``pos`` is the number of tokens
    already stored (= the absolute position of the next token). Keys are stored after rotation.
    """

    def __init__(self, n_layers: int, batch_size: int, n_kv_heads: int, max_len: int,
                 head_dim: int, device=None, dtype=None):
        shape = (n_layers, batch_size, n_kv_heads, max_len, head_dim)
        # uninitialised: slots at or beyond ``pos`` are never read (update returns :pos + T)
        self.k = torch.empty(shape, device=device, dtype=dtype)
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.pos = 0

    @property
    def max_len(self) -> int:
        return self.k.size(3)

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store new (B, nkv, T, hs) keys/values at ``pos`` and return all (B, nkv, pos+T, hs).

        Does not advance ``pos`` (every layer writes the same slots; :class:`GPT` advances it).

        Raises:
            ValueError: batch size differs from the cache's, or pos + T > max_len.
        """
        B, T = k.size(0), k.size(2)
        end = self.pos + T
        if B != self.k.size(1):
            raise ValueError(f"KV cache holds batch size {self.k.size(1)}, got {B}")
        if end > self.max_len:
            raise ValueError(f"KV cache is full: {self.pos} + {T} tokens > max_len={self.max_len}")
        self.k[layer, :, :, self.pos:end] = k
        self.v[layer, :, :, self.pos:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


def causal_mask(T_q: int, T_k: int, offset: int, device=None) -> Tensor:
    """(T_q, T_k) bool, True where query i (absolute position offset + i) may see key j <= it."""
    i = torch.arange(offset, offset + T_q, device=device)[:, None]
    return torch.arange(T_k, device=device)[None, :] <= i


class CausalSelfAttention(nn.Module):
    """Causal self-attention with grouped-query heads (Ainslie et al. 2023). (B,T,C) -> (B,T,C).

    nh query heads share nkv = ``cfg.n_query_groups`` key/value heads in groups of nh / nkv
    (nkv = nh: multi-head; nkv = 1: multi-query). Scores are q k^T / sqrt(hs) (Vaswani et al.
    2017, eq. 1) plus the position scheme's bias, under a causal mask.

    ``keep_weights`` (set by :meth:`GPT.attention_maps`) computes the same softmax explicitly and
    keeps it in ``weights`` (B, nh, T, T_k).
    """

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.n_head, self.n_kv, self.hs = cfg.n_heads, cfg.n_query_groups, cfg.head_dim
        self.layer_idx = layer_idx  # which slot of the KV cache is ours
        self.q = nn.Linear(cfg.d_model, self.n_head * self.hs, bias=cfg.bias)
        self.kv = nn.Linear(cfg.d_model, 2 * self.n_kv * self.hs, bias=cfg.bias)
        self.proj = nn.Linear(self.n_head * self.hs, cfg.d_model, bias=cfg.bias)
        self.dropout = cfg.dropout
        self.resid_drop = nn.Dropout(cfg.dropout)
        self.keep_weights = False
        self.weights: Tensor | None = None

    def forward(self, x: Tensor, position: Position, cache: KVCache | None = None) -> Tensor:
        B, T, C = x.shape
        offset = 0 if cache is None else cache.pos
        q = self.q(x).view(B, T, self.n_head, self.hs).transpose(1, 2)  # (B, nh, T, hs)
        k, v = self.kv(x).view(B, T, 2, self.n_kv, self.hs).permute(2, 0, 3, 1, 4)  # (B,nkv,T,hs)
        q, k = position.rotate(q, k, offset)
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)  # (B, nkv, offset + T, hs)
        rep = self.n_head // self.n_kv  # query head h reads kv head h // rep
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # (B,nh,T_k,hs)
        p_drop = self.dropout if self.training else 0.0
        bias = position.attn_bias(T, k.size(2), offset)  # (nh, T, T_k) or None
        if T == 1 and offset > 0 and not self.keep_weights:
            # One new token after the cache (a decode step) may see every cached key: no mask.
            # Written out, as SDPA's CPU kernel costs ~2x more at a single query.
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hs))  # (B, nh, 1, T_k)
            if bias is not None:
                att = att + bias
            y = F.dropout(att.softmax(dim=-1), p_drop) @ v  # (B, nh, 1, hs)
        elif bias is None and offset == 0 and not self.keep_weights:
            # plain causal from position 0: SDPA may use its fused (flash) kernel
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p_drop, is_causal=True)
        else:
            # explicit mask aligned so that absolute position offset + i sees keys 0..offset + i
            allowed = causal_mask(T, k.size(2), offset, x.device)
            mask = torch.zeros(allowed.shape, device=x.device) if bias is None else bias
            mask = mask.to(q.dtype).masked_fill(~allowed, float("-inf"))  # (nh, T, T_k) or (T, T_k)
            if self.keep_weights:
                att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hs) + mask  # (B, nh, T, T_k)
                self.weights = att.softmax(dim=-1)
                y = F.dropout(self.weights, p_drop) @ v
            else:
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p_drop)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * self.hs)  # re-assemble heads
        return self.resid_drop(self.proj(y))


# -------------------------------------------------------------------------------------- blocks


class Block(nn.Module):
    """One transformer layer: attention then feed-forward, each with a norm and a residual.
    Subclasses fix where the norm sits. (B, T, C) -> (B, T, C)."""

    final_norm: bool  # whether the model needs a norm after the last block

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.norm_1 = resolve(NORMS, cfg.norm)(cfg)
        self.attn = CausalSelfAttention(cfg, layer_idx)
        self.norm_2 = resolve(NORMS, cfg.norm)(cfg)
        self.ffn = resolve(FFNS, cfg.ffn)(cfg)


class PreNormBlock(Block):
    """Pre-norm (GPT-2, Radford et al. 2019; Xiong et al. 2020): x + f(norm(x))."""

    final_norm = True  # the residual stream itself is never normalised, so norm it before the head

    def forward(self, x: Tensor, position: Position, cache: KVCache | None = None) -> Tensor:
        x = x + self.attn(self.norm_1(x), position, cache)
        return x + self.ffn(self.norm_2(x))


class PostNormBlock(Block):
    """Post-norm (Vaswani et al. 2017; GPT-1, Radford et al. 2018): norm(x + f(x))."""

    final_norm = False  # the block output is already normalised

    def forward(self, x: Tensor, position: Position, cache: KVCache | None = None) -> Tensor:
        x = self.norm_1(x + self.attn(x, position, cache))
        return self.norm_2(x + self.ffn(x))


PLACEMENTS = {"pre": PreNormBlock, "post": PostNormBlock}

# ----------------------------------------------------------------------------------------- GPT


class GPT(nn.Module):
    """Decoder-only character LM built from a :class:`ModelConfig`.

    Token embedding ``wte`` (vocab, C) -> position scheme -> n_layers blocks -> final norm
    (pre-norm only) -> LM head (vocab, C), optionally tied to ``wte``. Init (GPT-2): normal(0, 0.02)
    for linears and embeddings, normal(0, 0.02 / sqrt(2 n_layers)) for the two residual output
    projections of every block, zero biases.

    Raises:
        ValueError: ``cfg.vocab_size`` < 1 (set it from the tokenizer first).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.vocab_size < 1:
            raise ValueError("GPT needs cfg.vocab_size >= 1; set it from the tokenizer")
        self.cfg = cfg
        block = PLACEMENTS[cfg.norm_placement]
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.position = resolve(POSITIONS, cfg.position)(cfg)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList([block(cfg, i) for i in range(cfg.n_layers)])
        self.norm_f = resolve(NORMS, cfg.norm)(cfg) if block.final_norm else nn.Identity()
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init_weights)
        for b in self.blocks:  # residual outputs: keep the stream's variance O(1) in depth
            # every built-in FFN's output matrix is ``down``; a user's component gets the same
            # init where it names its output matrix so (docs/components.md)
            down = getattr(b.ffn, "down", None)
            for proj in (b.attn.proj, *([down] if isinstance(down, nn.Linear) else [])):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))
        if cfg.tie_weights:  # Press & Wolf 2017
            self.lm_head.weight = self.wte.weight

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: Tensor, targets: Tensor | None = None,
                cache: KVCache | None = None) -> tuple[Tensor, Tensor | None]:
        """Logits (B, T, vocab) and mean cross-entropy in nats (or None without ``targets``).

        Args:
            idx: (B, T) int64 token ids; with a ``cache``, only the tokens not yet in it.
            targets: (B, T) int64 next-token ids; -1 marks positions left out of the loss.
            cache: a :class:`KVCache` from :meth:`init_cache`; positions start at ``cache.pos``
                and the cache is advanced by T.

        Raises:
            ValueError: the tokens would reach past the cache, or past the position table of a
                scheme that has one (learned positions: ``context_length`` rows). Other schemes
                run at any length (:attr:`Position.max_positions`), for length extrapolation.
        """
        B, T = idx.shape
        offset = 0 if cache is None else cache.pos
        if cache is not None and offset + T > cache.max_len:
            raise ValueError(f"sequence of {offset + T} tokens (cache {offset} + {T} new) exceeds "
                             f"the KV cache's max_len={cache.max_len}")
        limit = self.position.max_positions
        if limit is not None and offset + T > limit:
            raise ValueError(f"sequence of {offset + T} tokens exceeds the {self.cfg.position} "
                             f"position table of {limit} positions (context_length={limit}); "
                             f"position '{self.cfg.position}' cannot run past its table")
        x = self.drop(self.position.embed_ids(self.wte(idx), idx, offset))  # (B, T, C)
        for block in self.blocks:
            x = block(x, self.position, cache)
        logits = self.lm_head(self.norm_f(x))  # (B, T, vocab)
        if cache is not None:
            cache.pos += T
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-1)
        return logits, loss

    def init_cache(self, batch_size: int, device=None, max_len: int | None = None) -> KVCache:
        """An empty :class:`KVCache` for ``batch_size`` sequences of up to ``max_len`` tokens
        (default context_length), on ``device`` (default: the model's) in the model's dtype."""
        w = self.wte.weight
        return KVCache(self.cfg.n_layers, batch_size, self.cfg.n_query_groups,
                       max_len or self.cfg.context_length, self.cfg.head_dim,
                       device=device if device is not None else w.device, dtype=w.dtype)

    @torch.no_grad()
    def generate(self, idx: Tensor, max_new_tokens: int, temperature: float = 1.0,
                 greedy: bool = False, generator: torch.Generator | None = None) -> Tensor:
        """Extend (B, T) token ids by ``max_new_tokens`` -> (B, T + max_new_tokens).

        Prefills a KV cache with the prompt, then feeds one token per step. Once the cache holds
        context_length tokens (or the prompt is longer than that) it falls back to a full forward
        over the last context_length tokens per step. Call ``model.eval()`` first.

        Args:
            greedy: take the argmax; otherwise sample from softmax(logits / temperature).
            generator: RNG for sampling (on the model's device), for reproducible samples.

        Raises:
            ValueError: ``temperature`` <= 0 when sampling.
        """
        if not greedy and temperature <= 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
        ctx = self.cfg.context_length
        cache = self.init_cache(idx.size(0), idx.device) if idx.size(1) <= ctx else None
        for _ in range(max_new_tokens):
            if cache is not None and cache.pos < ctx:
                logits, _ = self(idx[:, cache.pos:], cache=cache)  # whole prompt first, then 1
            else:
                cache = None
                logits, _ = self(idx[:, -ctx:])
            logits = logits[:, -1].float()  # (B, vocab)
            if greedy:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                probs = F.softmax(logits / temperature, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator)
            idx = torch.cat((idx, nxt), dim=1)
        return idx

    @torch.no_grad()
    def attention_maps(self, idx: Tensor) -> Tensor:
        """Softmax attention weights (n_layers, B, nh, T, T) of (B, T) ids, in eval mode.

        Same projections, rotation, ALiBi bias and causal mask as :meth:`forward`; only the
        softmax is materialised instead of fused. Rows sum to 1; entries above the diagonal are 0.

        Raises:
            ValueError: T past the position table (as :meth:`forward`).
        """
        was_training = self.training
        attns = [b.attn for b in self.blocks]
        try:
            self.eval()
            for a in attns:
                a.keep_weights = True
            self(idx)
            return torch.stack([a.weights for a in attns])
        finally:
            for a in attns:
                a.keep_weights, a.weights = False, None
            self.train(was_training)

    def num_params(self, non_embedding: bool = False) -> int:
        """Number of parameters (a tied matrix counted once).

        ``non_embedding`` leaves out the token embedding, the learned position table and an
        untied LM head, following Kaplan et al. 2020 (sec. 2.1, "excluding all vocabulary and
        positional embeddings"); norms and biases stay in.
        """
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            emb = [self.wte.weight, self.lm_head.weight, *self.position.parameters()]
            n -= sum(p.numel() for p in {id(p): p for p in emb}.values())
        return n


# ---------------------------------------------------------------------- counts and pre-flight


@lru_cache(maxsize=4096)
def count_params(cfg: ModelConfig) -> tuple[int, int]:
    """(total, non_embedding) parameters of ``GPT(cfg)`` (see :meth:`GPT.num_params`).

    The model is built on the CPU with the global RNG state restored afterwards: milliseconds at
    the sizes studied here, where the first ``meta``-device build in a process costs ~1 s of
    imports. Cached per config (a frozen dataclass): the budget rules ask for the same few
    widths thousands of times, and a profile's larger models take 16 ms each to build.

    Raises:
        ValueError: ``cfg.vocab_size`` < 1.
    """
    with GLOBAL_RNG_LOCK, torch.random.fork_rng(devices=[]):
        model = GPT(cfg)
    return model.num_params(), model.num_params(non_embedding=True)


def _non_embedding(cfg: ModelConfig) -> int:
    # the non-embedding count does not depend on the vocabulary, so a placeholder of 1 is fine
    return count_params(cfg.replace(vocab_size=max(cfg.vocab_size, 1)))[1]


def flops_per_token(cfg: ModelConfig) -> int:
    """Training FLOPs per token, Kaplan et al. 2020, Table 1: forward C = 2 N + 2 n_layers n_ctx C
    (N non-embedding parameters, the second term the attention scores), training = 3 forward
    = 6 N + 6 n_layers n_ctx C. N is the exact count (biases and norms included), not Kaplan's
    12 n_layers C^2 approximation. The vocabulary does not enter.
    """
    return 6 * _non_embedding(cfg) + 6 * cfg.n_layers * cfg.context_length * cfg.d_model


def match_ffn_hidden(cfg: ModelConfig, reference: ModelConfig,
                     tolerance: float = 0.02) -> ModelConfig:
    """``cfg`` with ``ffn_hidden`` set so its non-embedding parameter count is within
    ``tolerance`` (relative) of ``reference``'s.

    The count is affine in the hidden width, so the ideal width is solved for exactly; the
    closest multiple of ``cfg.ffn_multiple_of`` within tolerance is preferred, else the closest
    integer >= 1.

    Raises:
        ValueError: no width >= 1 gets within tolerance (e.g. the rest of ``cfg`` alone is larger),
            or the count does not grow with ``ffn_hidden`` (a user's FFN that ignores it).
    """
    target = _non_embedding(reference)
    n1, n2 = _non_embedding(cfg.replace(ffn_hidden=1)), _non_embedding(cfg.replace(ffn_hidden=2))
    per_unit, base = n2 - n1, n1 - (n2 - n1)  # count(h) = base + h * per_unit
    if per_unit <= 0:  # a user's FFN that does not size its hidden layer by cfg.ffn_hidden_size
        raise ValueError(f"study.match_params: ffn {cfg.ffn}'s parameter count does not grow "
                         "with ffn_hidden, so it cannot be matched to the baseline's; size its "
                         "hidden layer by cfg.ffn_hidden_size, or set match_params: false")
    ideal = (target - base) / per_unit
    m = cfg.ffn_multiple_of
    multiples = [m * math.floor(ideal / m), m * math.ceil(ideal / m)]
    integers = [math.floor(ideal), math.ceil(ideal)]
    for candidates in (multiples, integers):
        ok = [h for h in candidates
              if h >= 1 and abs(base + h * per_unit - target) <= tolerance * target]
        if ok:
            best = min(ok, key=lambda h: abs(base + h * per_unit - target))
            return cfg.replace(ffn_hidden=best)
    raise ValueError(
        f"cannot match parameters: {cfg.ffn} at d_model={cfg.d_model} needs ffn_hidden~{ideal:.1f} "
        f"to reach {target} non-embedding parameters (reference {reference.ffn}), "
        f"none >= 1 within {tolerance:.1%}")


class CausalityError(ValueError):
    """A model's logits at position p changed when only tokens after p changed."""


def check_causality(cfg: ModelConfig, seed: int = 0, t: int | None = None,
                    atol: float = 1e-5, length: int | None = None) -> None:
    """Pre-flight check that a fresh fp32 ``GPT(cfg)`` cannot see the future.

    Two sequences of T = ``length`` (default context_length) random tokens (batch 2) are run;
    the copy has every token after position ``t`` changed. Logits at positions <= t must agree
    within ``atol``. With ``t=None`` the cut is tried at 0, T/4, T/2 and T-2. A ``length`` past
    the context checks the mask and positions used for length extrapolation. Global RNG state is
    left untouched.

    Raises:
        CausalityError: naming the config (ffn, norm, placement, position, kv heads) and the
            first position whose logits moved.
        ValueError: ``cfg.vocab_size`` < 2, ``t`` not in [0, T - 2], or a ``length`` past a
            learned position table.
    """
    if cfg.vocab_size < 2:
        raise ValueError("check_causality needs cfg.vocab_size >= 2 to perturb tokens")
    T, V = length or cfg.context_length, cfg.vocab_size
    cuts = [t] if t is not None else sorted({c for c in (0, T // 4, T // 2, T - 2) if c >= 0})
    for cut in cuts:
        if not 0 <= cut <= T - 2:
            raise ValueError(f"t={cut} must be in [0, {T - 2}] for sequences of {T} tokens")
    with GLOBAL_RNG_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT(cfg).float().eval()
        idx = torch.randint(V, (2, T))
        shifts = torch.randint(1, V, (2, T))
        with torch.no_grad():
            logits, _ = model(idx)
            for cut in cuts:
                other = idx.clone()
                other[:, cut + 1:] = (idx[:, cut + 1:] + shifts[:, cut + 1:]) % V  # all differ
                diff = (model(other)[0] - logits)[:, :cut + 1].abs().amax(dim=(0, 2))  # (cut+1,)
                leaks = (diff > atol).nonzero()
                if len(leaks):
                    p = int(leaks[0])
                    raise CausalityError(
                        f"model ffn={cfg.ffn} norm={cfg.norm} placement={cfg.norm_placement} "
                        f"position={cfg.position} n_kv_heads={cfg.n_query_groups} leaks the "
                        f"future: logits at position {p} changed by {float(diff[p]):.3g} when "
                        f"only tokens after position {cut} changed")
