"""python -m torchtrace.precision: the mixed-precision table of a small character GPT, in bfloat16 and float16.

For each dtype: the five rules of the backward with the largest relative error against float32, the share of
gradient elements that underflowed without loss scaling and with a scale of 2**16, and the steps
torch.amp.GradScaler skipped in a short training loop (with the rule that made the first inf).

    python -m torchtrace.precision [--steps 30] [--seed 0] [--device cpu]
"""
import argparse
import math
from typing import List

import torch
import torch.nn.functional as F
from torch import nn

import torchtrace as tt
from torchtrace.precision.run import precision
from torchtrace.precision.training import training

TEXT = "the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. " * 4


class SmallGPT(nn.Module):
    """Token and position embeddings, one pre-norm block (causal attention, a GELU MLP), a linear head."""

    def __init__(self, vocab: int, d: int = 32, heads: int = 4, block: int = 16) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.ln1, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln2, self.fc, self.mlp_proj = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.ln_f, self.head, self.heads = nn.LayerNorm(d), nn.Linear(d, vocab), heads
        self.register_buffer("causal", torch.tril(torch.ones(block, block, dtype=torch.bool)))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        q, k, v = self.qkv(self.ln1(x)).split(x.shape[-1], dim=-1)
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~self.causal[:T, :T], float("-inf"))
        x = x + self.proj((att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, -1))
        x = x + self.mlp_proj(F.gelu(self.fc(self.ln2(x))))
        return self.head(self.ln_f(x))


def gpt_loss(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
    """Next-token cross entropy: the model reads idx[:, :-1] and predicts idx[:, 1:]."""
    logits = model(idx[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1))


def table(steps: int = 30, seed: int = 0, device: str = "cpu") -> str:
    """The table, as text."""
    torch.manual_seed(seed)
    chars = sorted(set(TEXT))
    data = torch.tensor([chars.index(c) for c in TEXT], device=device)
    block = 16
    starts = torch.randint(0, len(data) - block - 1, (steps, 8))
    batches = [torch.stack([data[s:s + block + 1] for s in row.tolist()]) for row in starts]
    base = SmallGPT(len(chars)).to(device)

    lines: List[str] = []
    for dtype in (torch.bfloat16, torch.float16):
        model = tt.port(SmallGPT(len(chars)).to(device))
        model.load_state_dict(base.state_dict())
        plain = precision(lambda idx: gpt_loss(model, idx), batches[0], dtype=dtype)
        scaled = precision(lambda idx: gpt_loss(model, idx), batches[0], dtype=dtype, scale=2.0 ** 16)
        name = str(dtype).replace("torch.", "")
        lines += [f"## {name} (device {device}, loss {plain.low.loss:.5f} vs float32 {plain.reference.loss:.5f})", "",
                  "| rule | module | ran in | why | rel. error | underflow | subnormal |",
                  "|---|---|---|---|---|---|---|"]
        for row in plain.top(5, by="rel_error", phase="backward"):
            lines.append(f"| {row.rule} | {row.module} | {str(row.dtype).replace('torch.', '')} | {row.why} | "
                         f"{row.rel_error:.2e} | {row.underflow:.2%} | {row.subnormal:.2%} |")
        leaves, leaves_scaled = plain.leaf_counts(), scaled.leaf_counts()
        lines += ["", f"gradient elements the rules sent that underflowed: {plain.gradient_underflow:.3%} at scale 1, "
                  f"{scaled.gradient_underflow:.3%} at scale 2**16",
                  f"parameter gradients that underflowed: {leaves.share('underflow'):.3%} at scale 1, "
                  f"{leaves_scaled.share('underflow'):.3%} at scale 2**16"]
        optimizer = tt.optim.AdamW(model.parameters(), lr=3e-3)
        scaler = torch.amp.GradScaler(device, growth_interval=5)
        with training(model, optimizer, scaler) as watched:
            for idx in batches:
                optimizer.zero_grad()
                with torch.autocast(device, dtype=dtype):
                    loss = gpt_loss(model, idx)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
        lines += [f"GradScaler over {steps} AdamW steps (initial scale 2**16, growth every 5 good steps): "
                  f"{len(watched.skipped)} skipped {watched.skipped}, final scale {scaler.get_scale():g}"]
        lines += [f"  {s}" for s in watched.steps if s.skipped][:5] + [""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    print(table(args.steps, args.seed, args.device))


if __name__ == "__main__":
    main()
