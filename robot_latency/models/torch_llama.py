"""The planner's llama decoder in torch, as llama.cpp computes it (for training and checks).

RMSNorm, RoPE in llama.cpp's "normal" mode (adjacent pairs, see
:mod:`robot_latency.models.export`), grouped-query attention, SwiGLU FFN, untied output head;
:meth:`LlamaModel.from_gguf` / :meth:`LlamaModel.gguf_tensors` move weights to and from a GGUF.
Trained by :mod:`robot_latency.models.train`.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from robot_latency.models.export import GGUFShape, read_gguf

KV = tuple[torch.Tensor, torch.Tensor]  # one block's keys and values, (B, n_kv_heads, T, hd)


class RMSNorm(nn.Module):
    """RMSNorm as llama.cpp computes it: ``x / sqrt(mean(x^2) + eps) * weight``."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(head_dim: int, n_pos: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Return cos/sin tables ``(n_pos, head_dim/2)`` for llama.cpp's normal-mode RoPE."""
    inv = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    ang = torch.arange(n_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().float(), ang.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs ``(x[2i], x[2i+1])``; x is ``(B, H, T, D)``, tables ``(T, D/2)``."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-2)


class Block(nn.Module):
    """One llama block; attribute names follow the GGUF tensor names."""

    def __init__(self, s: GGUFShape) -> None:
        super().__init__()
        hd = s.head_dim
        self.n_heads, self.n_kv, self.hd = s.n_heads, s.n_kv_heads, hd
        self.attn_norm = RMSNorm(s.dim, s.norm_eps)
        self.attn_q = nn.Linear(s.dim, s.n_heads * hd, bias=False)
        self.attn_k = nn.Linear(s.dim, s.n_kv_heads * hd, bias=False)
        self.attn_v = nn.Linear(s.dim, s.n_kv_heads * hd, bias=False)
        self.attn_output = nn.Linear(s.n_heads * hd, s.dim, bias=False)
        self.ffn_norm = RMSNorm(s.dim, s.norm_eps)
        self.ffn_gate = nn.Linear(s.dim, s.ffn_dim, bias=False)
        self.ffn_up = nn.Linear(s.dim, s.ffn_dim, bias=False)
        self.ffn_down = nn.Linear(s.ffn_dim, s.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.forward_cached(x, cos, sin)[0]

    def forward_cached(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       past: KV | None = None) -> tuple[torch.Tensor, KV]:
        """Run the block on ``x`` after ``past`` (keys/values of earlier positions, batch 1 or
        B); return the output and this block's keys/values of past and x together."""
        b, t, _ = x.shape
        h = self.attn_norm(x)
        q = self.attn_q(h).view(b, t, self.n_heads, self.hd).transpose(1, 2)  # (B, nh, T, hd)
        k = self.attn_k(h).view(b, t, self.n_kv, self.hd).transpose(1, 2)  # (B, nkv, T, hd)
        v = self.attn_v(h).view(b, t, self.n_kv, self.hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        mask = None
        if past is not None:
            pk, pv = past  # (1 or B, nkv, P, hd): a shared prefix is computed once, at batch 1
            k = torch.cat((pk.expand(b, -1, -1, -1), k), dim=2)
            v = torch.cat((pv.expand(b, -1, -1, -1), v), dim=2)
            n_past = pk.shape[2]
            mask = torch.ones(t, n_past + t, dtype=torch.bool, device=x.device)
            mask[:, n_past:] = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        kv = (k, v)
        # Query head i reads KV head i // (nh / nkv), as ggml broadcasts it.
        rep = self.n_heads // self.n_kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        x = x + self.attn_output(a.transpose(1, 2).reshape(b, t, self.n_heads * self.hd))
        h = self.ffn_norm(x)
        return x + self.ffn_down(F.silu(self.ffn_gate(h)) * self.ffn_up(h)), kv


class LlamaModel(nn.Module):
    """A llama decoder whose parameters map one-to-one onto GGUF tensors.

    Args:
        shape: hyper-parameters.
    """

    def __init__(self, shape: GGUFShape) -> None:
        super().__init__()
        self.shape = shape
        self.token_embd = nn.Embedding(shape.vocab_size, shape.dim)
        self.blk = nn.ModuleList(Block(shape) for _ in range(shape.n_layers))
        self.output_norm = RMSNorm(shape.dim, shape.norm_eps)
        self.output = nn.Linear(shape.dim, shape.vocab_size, bias=False)
        cos, sin = rope_tables(shape.head_dim, shape.context_length, shape.rope_base)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith(("attn_output.weight", "ffn_down.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * shape.n_layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Return logits ``(B, T, V)`` for ids ``(B, T)`` starting at position 0."""
        t = ids.shape[1]
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        x = self.token_embd(ids)
        for block in self.blk:
            x = block(x, cos, sin)
        return self.output(self.output_norm(x))

    def forward_cached(self, ids: torch.Tensor, past: list[KV] | None = None
                       ) -> tuple[torch.Tensor, list[KV]]:
        """Return logits ``(B, T, V)`` for ids ``(B, T)`` that follow ``past`` (per block keys
        and values of the positions before, batch 1 or B), and the keys/values of past + ids.

        A fixed prompt prefix is run once at batch 1 and its keys/values passed as ``past`` for
        a whole batch of continuations: positions (RoPE) continue after it, as in llama.cpp.
        """
        start = 0 if past is None else past[0][0].shape[2]
        t = ids.shape[1]
        cos, sin = self.rope_cos[start:start + t], self.rope_sin[start:start + t]
        x = self.token_embd(ids)
        out: list[KV] = []
        for i, block in enumerate(self.blk):
            x, kv = block.forward_cached(x, cos, sin, None if past is None else past[i])
            out.append(kv)
        return self.output(self.output_norm(x)), out

    def n_params(self) -> int:
        """Return the parameter count."""
        return sum(p.numel() for p in self.parameters())

    @classmethod
    def from_gguf(cls, path: str | Path) -> LlamaModel:
        """Load a GGUF written by :func:`robot_latency.models.export.export_gguf` into torch.

        Args:
            path: the GGUF file (F32 or F16).

        Returns:
            The model in eval mode.
        """
        shape, tensors = read_gguf(path)
        model = cls(shape)
        model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in tensors.items()})
        return model.eval()

    def gguf_tensors(self) -> dict[str, np.ndarray]:
        """Return the weights as ``{gguf_name: float32 array}``."""
        out = {}
        for name, p in self.state_dict().items():
            out[name] = p.detach().float().cpu().numpy()
        return out
