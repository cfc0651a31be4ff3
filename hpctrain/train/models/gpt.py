"""A GPT-style decoder (nanoGPT's shape), used for tokens/s and MFU on GPUs.

``vocab_pad_to``: the embedding and output head get a vocabulary rounded up to a multiple of this
(nanoGPT pads GPT-2's 50257 to 50304 = 64 x 786): matmul shapes that tensor cores tile well, for a few
unused rows. ``forward(idx, targets)`` computes the loss inside the model, upcast to fp32, so that it is
part of the compiled graph (``loss=model``); both forms return the logits of the real vocabulary only.
"""

import math
from typing import Optional, Tuple, Union

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln1 = nn.LayerNorm(n_embd)
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        # flash / memory-efficient attention where the backend has it
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, n_layer: int = 4, n_head: int = 4, n_embd: int = 128,
                 vocab_pad_to: int = 1) -> None:
        super().__init__()
        if vocab_pad_to < 1:
            raise ValueError(f"model.vocab_pad_to={vocab_pad_to}: expected an integer >= 1 (1: no padding)")
        self.block_size, self.vocab_size = block_size, vocab_size
        self.n_layer, self.n_head, self.n_embd = n_layer, n_head, n_embd
        padded = -(-vocab_size // vocab_pad_to) * vocab_pad_to
        self.tok_emb = nn.Embedding(padded, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, padded, bias=False)
        self.head.weight = self.tok_emb.weight  # weight tying
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None
                ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        """Logits ``(B, T, vocab_size)``; with ``targets``, ``(logits, loss)`` (nanoGPT's convention)."""
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        # the head's matmul runs on the padded shape; its padding columns are sliced off (a view) before any loss
        logits = self.head(self.ln_f(x))[..., : self.vocab_size]
        if targets is None:
            return logits
        # fp32 log-softmax inside the (compiled) graph: Inductor fuses the slice and the upcast into it
        loss = F.cross_entropy(logits.float().reshape(-1, self.vocab_size), targets.reshape(-1))
        return logits, loss

    def flops_per_sample(self) -> float:
        """Training FLOPs per sequence (PaLM appendix B: 6N per token plus attention)."""
        n_params = sum(p.numel() for p in self.parameters()) - self.pos_emb.weight.numel()
        t = self.block_size
        per_token = 6 * n_params + 12 * self.n_layer * self.n_embd * t
        return per_token * t
