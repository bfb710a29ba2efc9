"""Five small models for the doctor's seeded-fault tests: an MLP, a CNN, a small GPT, and two models with the
architecture of HuggingFace's BERT and GPT-2 (written here in torch.nn, as those classes are: embeddings, attention
with an additive mask of torch.finfo(dtype).min, GELU / tanh-GELU, Conv1D as addmm, a tied LM head).

Each model has a `fault` attribute; the lines a fault changes carry a `# fault:` comment, so a test can ask
the doctor for exactly that line (`line_of` finds a marker on the line it is written on).
"""
import math
from pathlib import Path

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

import torchtrace as tt


def line_of(marker: str, path: Path = Path(__file__)) -> str:
    """"doctor_models.py:N" for the one line of this file that carries `marker`."""
    hits = [n for n, text in enumerate(path.read_text().splitlines(), 1) if text.rstrip().endswith("# " + marker)]
    assert len(hits) == 1, f"{marker!r} is on {len(hits)} lines"
    return f"{path.name}:{hits[0]}"


class WrongRelu(tt.Function):
    """A student's ReLU whose backward lets the gradient through where the input was negative."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clamp_min(0)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (x < 0)


class WrongTanh(tt.Function):
    """A student's tanh with the derivative 1 - y instead of 1 - y^2."""

    @staticmethod
    def forward(ctx, x):
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * (1 - y)


def hand_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross entropy written out as -log softmax[target]: a probability that underflows to 0 gives log(0)."""
    probs = logits.softmax(-1)
    picked = probs.gather(-1, target.unsqueeze(-1))
    return -picked.log().mean()  # fault: log


class MLP(nn.Module):
    def __init__(self, d_in: int = 8, hidden: int = 32, classes: int = 4) -> None:
        super().__init__()
        self.fc1, self.act1 = nn.Linear(d_in, hidden), nn.ReLU()
        self.fc2, self.act2 = nn.Linear(hidden, hidden), nn.ReLU()
        self.fc3 = nn.Linear(hidden, classes)
        self.fault = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fault == "standardise":
            x = (x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True)  # fault: mlp standardise
        h = self.act1(self.fc1(x))
        if self.fault == "data":
            h = h.data  # fault: data mlp
        if self.fault == "sqrt":
            h = torch.sqrt(h - 0.5)  # fault: mlp sqrt
        if self.fault == "detach":
            h = h.detach()  # fault: detach mlp
        z = self.fc2(h)
        h = WrongRelu.apply(z) if self.fault == "wrong rule" else self.act2(z)  # fault: mlp act2
        return self.fc3(h)


class CNN(nn.Module):
    """conv -> batch norm -> ReLU -> pool, twice; the first conv keeps its bias (zero by construction)."""

    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.conv1, self.bn1, self.act1 = nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()
        self.conv2, self.act2 = nn.Conv2d(8, 8, 3, padding=1), nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 2 * 2, classes)
        self.fault = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pool(self.act1(self.bn1(self.conv1(x))))
        if self.fault == "sqrt":
            h = torch.sqrt(h - 1.0)  # fault: cnn sqrt
        if self.fault == "detach":
            h = h.detach()  # fault: detach cnn
        z = self.conv2(h)
        h = WrongRelu.apply(z) if self.fault == "wrong rule" else self.act2(z)  # fault: cnn act2
        return self.fc(self.pool(h).flatten(1))


class CausalSelfAttention(nn.Module):
    def __init__(self, d: int, heads: int, block: int) -> None:
        super().__init__()
        self.qkv, self.proj, self.heads = nn.Linear(d, 3 * d), nn.Linear(d, d), heads
        self.register_buffer("causal", torch.tril(torch.ones(block, block, dtype=torch.bool)))

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = q @ k.transpose(-2, -1) / math.sqrt(C // self.heads)
        att = att.masked_fill(~self.causal[:T, :T], float("-inf"))
        att = att.masked_fill(~keep[:, None, None, :], float("-inf"))  # padding: a fully padded row is all -inf
        att = att.softmax(-1)  # fault: gpt softmax
        return self.proj((att @ v).transpose(1, 2).reshape(B, T, C))


class GPT(nn.Module):
    """A one-block character GPT (pre-norm, causal attention, a ReLU MLP)."""

    def __init__(self, vocab: int = 12, d: int = 16, heads: int = 2, block: int = 8) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.ln1, self.attn = nn.LayerNorm(d), CausalSelfAttention(d, heads, block)
        self.ln2, self.fc, self.act = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.ReLU()
        self.mlp_proj = nn.Linear(4 * d, d)
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)
        self.fault = None

    def forward(self, idx: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        pos = self.wpe(torch.arange(idx.shape[1]))
        if self.fault == "detach":
            pos = pos.detach()  # fault: detach gpt
        x = self.wte(idx) + pos
        x = x + self.attn(self.ln1(x), keep)
        z = self.fc(self.ln2(x))
        h = WrongRelu.apply(z) if self.fault == "wrong rule" else self.act(z)  # fault: gpt act
        x = x + self.mlp_proj(h)
        return self.head(self.ln_f(x))


class BertSelfAttention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.query, self.key, self.value, self.heads = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d), heads

    def forward(self, x: torch.Tensor, extended_mask: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (lin(x).view(B, T, self.heads, C // self.heads).transpose(1, 2)
                   for lin in (self.query, self.key, self.value))
        scores = q @ k.transpose(-1, -2) / math.sqrt(C // self.heads) + extended_mask
        probs = nn.functional.softmax(scores, dim=-1)  # fault: bert softmax
        return (probs @ v).transpose(1, 2).reshape(B, T, C)


class BertLayer(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.attention = BertSelfAttention(d, heads)
        self.attention_output, self.attention_norm = nn.Linear(d, d), nn.LayerNorm(d, eps=1e-12)
        self.intermediate, self.intermediate_act = nn.Linear(d, 4 * d), nn.GELU()
        self.output, self.output_norm = nn.Linear(4 * d, d), nn.LayerNorm(d, eps=1e-12)

    def forward(self, x: torch.Tensor, extended_mask: torch.Tensor) -> torch.Tensor:
        x = self.attention_norm(x + self.attention_output(self.attention(x, extended_mask)))
        return self.output_norm(x + self.output(self.intermediate_act(self.intermediate(x))))


class BertClassifier(nn.Module):
    """BERT's shape: word + position + token-type embeddings, LayerNorm, post-norm layers, a tanh pooler."""

    def __init__(self, vocab: int = 20, d: int = 16, heads: int = 2, layers: int = 2, block: int = 8,
                 classes: int = 3) -> None:
        super().__init__()
        self.word_embeddings, self.position_embeddings = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.token_type_embeddings, self.embeddings_norm = nn.Embedding(2, d), nn.LayerNorm(d, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(d, heads) for _ in range(layers))
        self.pooler, self.pooler_act = nn.Linear(d, d), nn.Tanh()
        self.classifier = nn.Linear(d, classes)
        self.fault = None

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        T = ids.shape[1]
        x = self.word_embeddings(ids) + self.position_embeddings(torch.arange(T)) + \
            self.token_type_embeddings(torch.zeros_like(ids))
        x = self.embeddings_norm(x)
        if self.fault == "-inf mask":
            extended = torch.zeros(attention_mask.shape).masked_fill(attention_mask == 0, float("-inf"))
        else:  # HuggingFace's: (1 - mask) * finfo.min, finite, so a fully padded row stays finite
            extended = (1.0 - attention_mask.float()) * torch.finfo(torch.float32).min
        extended = extended[:, None, None, :]
        for layer in self.layers:
            x = layer(x, extended)
        first = x[:, 0]
        if self.fault == "detach":
            first = first.detach()  # fault: detach bert
        pooled = self.pooler_act(self.pooler(first))  # fault: bert pooler
        return self.classifier(pooled)


class Conv1D(nn.Module):
    """GPT-2's linear layer: weight of shape (in, out), y = addmm(b, x, W)."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.randn(nx, nf) * 0.02), nn.Parameter(torch.zeros(nf))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


class NewGELU(nn.Module):
    """GPT-2's tanh approximation of GELU."""

    fault = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))
        t = WrongTanh.apply(inner) if self.fault == "wrong rule" else torch.tanh(inner)  # fault: gpt2 gelu
        return 0.5 * x * (1.0 + t)


class GPT2Block(nn.Module):
    def __init__(self, d: int, heads: int, block: int) -> None:
        super().__init__()
        self.ln_1, self.c_attn, self.attn_proj = nn.LayerNorm(d), Conv1D(3 * d, d), Conv1D(d, d)
        self.ln_2, self.c_fc, self.act, self.mlp_proj = nn.LayerNorm(d), Conv1D(4 * d, d), NewGELU(), Conv1D(d, 4 * d)
        self.heads = heads
        self.register_buffer("bias", torch.tril(torch.ones(block, block, dtype=torch.bool)))

    def attention(self, x: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        w = q @ k.transpose(-1, -2) / math.sqrt(C // self.heads)
        w = torch.where(self.bias[:T, :T], w, torch.finfo(w.dtype).min)
        w = nn.functional.softmax(w + additive_mask, dim=-1)  # fault: gpt2 softmax
        return self.attn_proj((w @ v).transpose(1, 2).reshape(B, T, C))

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln_1(x), additive_mask)
        return x + self.mlp_proj(self.act(self.c_fc(self.ln_2(x))))


class GPT2LM(nn.Module):
    """GPT-2's shape: token and position embeddings, pre-norm blocks, a final LayerNorm, a head tied to wte."""

    def __init__(self, vocab: int = 12, d: int = 16, heads: int = 2, layers: int = 2, block: int = 8) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.h = nn.ModuleList(GPT2Block(d, heads, block) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.fault = None
        self.checkpoint = False  # recompute each block in backward (torch.utils.checkpoint)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.fault == "-inf mask":
            additive = torch.zeros(attention_mask.shape).masked_fill(attention_mask == 0, float("-inf"))
        else:  # HuggingFace's finite mask
            additive = (1.0 - attention_mask.float()) * torch.finfo(torch.float32).min
        for block in self.h:
            block.act.fault = self.fault
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        if self.fault == "detach":
            x = x.detach()  # fault: detach gpt2
        for block in self.h:
            if self.checkpoint:
                x = torch.utils.checkpoint.checkpoint(block, x, additive[:, None, None, :], use_reentrant=True)
            else:
                x = block(x, additive[:, None, None, :])
        return self.ln_f(x) @ self.wte.weight.T


def batch(kind: str, seed: int = 0, left_padded: bool = False):
    """A fixed batch for each model kind: (inputs tuple, targets)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "mlp":
        return (torch.randn(16, 8, generator=g),), torch.randint(0, 4, (16,), generator=g)
    if kind == "cnn":
        return (torch.randn(8, 1, 8, 8, generator=g),), torch.randint(0, 4, (8,), generator=g)
    ids = torch.randint(0, 12, (4, 8), generator=g)
    keep = torch.ones(4, 8, dtype=torch.bool)
    keep[1, 6:] = False  # right padding in one example: every row keeps a key
    if left_padded:
        keep[2, :3] = False  # left padding with a causal mask: the first query rows can see only padding
    if kind == "gpt":
        return (ids, keep), torch.randint(0, 12, (4, 8), generator=g)
    mask = keep.long()
    if left_padded:
        mask[3] = 0  # a fully padded example: every key of its rows is masked
    if kind == "bert":
        return (ids, mask), torch.randint(0, 3, (4,), generator=g)
    return (ids, mask), torch.randint(0, 12, (4, 8), generator=g)


MODELS = {"mlp": MLP, "cnn": CNN, "gpt": GPT, "bert": BertClassifier, "gpt2": GPT2LM}


def build(kind: str, seed: int = 0, port: bool = True) -> nn.Module:
    torch.manual_seed(seed)
    model = MODELS[kind]()
    return tt.port(model) if port else model


def loss_fn(model: nn.Module, kind: str, inputs: tuple, target: torch.Tensor, hand_written: bool = False):
    """The model's loss: cross entropy over classes (or next tokens); `hand_written` uses -log softmax[target]."""
    logits = model(*inputs)
    if hand_written:
        return hand_cross_entropy(logits.reshape(-1, logits.shape[-1]) * 1000.0, target.reshape(-1))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
