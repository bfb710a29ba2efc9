"""A small character-level GPT, trained with torchtrace's gradients on the Zen of Python (it ships with Python).

The model is the usual decoder-only transformer, written with tt.nn layers: token and position embeddings,
pre-LayerNorm blocks of causal multi-head self-attention and a GELU MLP with residual connections, a final
LayerNorm and a linear head. Attention is spelled out with plain tensor ops (matmul, masked_fill, softmax),
so every one of them is a node in torchtrace's graph:

    att = softmax(mask(q k^T / sqrt(d)))      y = att v       (mask: position t sees positions <= t only)

The text is small (~860 characters), so the model learns it almost by heart: the sample before training is
noise, the sample after training reads like the Zen. `--text FILE` trains on any other text file.

    python examples/char_gpt.py              # 800 steps
    python examples/char_gpt.py --smoke      # 40 steps of a smaller model (what CI runs)
"""
import argparse
import codecs
import contextlib
import io
import math
import time
from typing import Any, Dict, Optional, Sequence

import torch
import torch.nn.functional as F

import torchtrace as tt
from torchtrace import nn


def zen_of_python() -> str:
    """The Zen of Python, as `import this` prints it (stored rot13-encoded in the standard library's this.py)."""
    with contextlib.redirect_stdout(io.StringIO()):  # importing `this` prints the text
        import this
    return codecs.decode(this.s, "rot13") + "\n"


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int, block_size: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)  # queries, keys and values of all heads in one matmul
        self.proj = nn.Linear(width, width)
        self.register_buffer("mask", torch.tril(torch.ones(block_size, block_size, dtype=torch.bool)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time_steps, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        # (B, T, C) -> (B, heads, T, C / heads): each head attends on its own slice of the channels
        q, k, v = (t.view(batch, time_steps, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~self.mask[:time_steps, :time_steps], float("-inf"))
        y = scores.softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(batch, time_steps, width))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, block_size: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, block_size)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))  # residual connections: gradients reach early blocks undiminished
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, width: int, heads: int, layers: int):
        super().__init__()
        self.block_size = block_size
        self.token = nn.Embedding(vocab_size, width)
        self.position = nn.Embedding(block_size, width)
        self.blocks = nn.Sequential(*[Block(width, heads, block_size) for _ in range(layers)])
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1])
        x = self.token(idx) + self.position(positions)
        return self.head(self.ln(self.blocks(x)))  # logits, (B, T, vocab)

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, steps: int, generator: torch.Generator,
                 temperature: float = 0.8) -> torch.Tensor:
        """Sample `steps` characters, one at a time, each from softmax(logits / temperature) of the last position."""
        for _ in range(steps):
            logits = self(idx[:, -self.block_size:])[:, -1, :] / temperature
            next_id = torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)
            idx = torch.cat([idx, next_id], dim=1)
        return idx


class Vocabulary:
    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([self.index[c] for c in text])

    def decode(self, ids: torch.Tensor) -> str:
        return "".join(self.chars[i] for i in ids.tolist())


def sample(model: GPT, vocab: Vocabulary, prompt: str, length: int, seed: int) -> str:
    model.eval()
    ids = model.generate(vocab.encode(prompt)[None], length, torch.Generator().manual_seed(seed))
    model.train()
    return vocab.decode(ids[0])


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--text", help="a text file to train on instead of the Zen of Python")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--sample-length", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (small networks run fastest on one)")
    parser.add_argument("--smoke", action="store_true", help="40 steps of a one-layer model (for CI)")
    args = parser.parse_args(argv)
    if args.smoke:  # smaller defaults; options given explicitly still win
        parser.set_defaults(steps=40, layers=1, block_size=32, batch_size=16, sample_length=60)
        args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    text = open(args.text, encoding="utf-8").read() if args.text else zen_of_python()
    vocab = Vocabulary(text)
    data = vocab.encode(text)
    torch.manual_seed(args.seed)
    model = GPT(len(vocab.chars), args.block_size, args.width, args.heads, args.layers)
    optimizer = tt.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = tt.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps, eta_min=args.lr / 10)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"text: {len(text)} characters, vocabulary of {len(vocab.chars)}; model: {n_params} parameters")

    prompt = text[:1]
    before = sample(model, vocab, prompt, args.sample_length, args.seed)
    print(f"--- sample before training ---\n{before}\n")

    batches = torch.Generator().manual_seed(args.seed)
    losses = []
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        offsets = torch.randint(len(data) - args.block_size - 1, (args.batch_size,), generator=batches)
        x = torch.stack([data[i:i + args.block_size] for i in offsets.tolist()])
        y = torch.stack([data[i + 1:i + args.block_size + 1] for i in offsets.tolist()])  # the next characters
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        if step == 1 or step % max(1, args.steps // 10) == 0:
            print(f"step {step:5d}  loss {loss.item():.4f}  ({time.perf_counter() - start:.1f} s)")
    seconds = time.perf_counter() - start

    after = sample(model, vocab, prompt, args.sample_length, args.seed)
    print(f"\n--- sample after training ---\n{after}\n")
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} in {args.steps} steps, {seconds:.1f} s "
          f"(uniform guessing: {math.log(len(vocab.chars)):.3f})")
    return {"losses": losses, "sample_before": before, "sample_after": after, "seconds": seconds,
            "vocab_size": len(vocab.chars), "text": text}


if __name__ == "__main__":
    main()
