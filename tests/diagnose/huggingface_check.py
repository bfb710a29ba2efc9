"""The doctor on HuggingFace's own BERT and GPT-2 classes (tiny configs built here, nothing downloaded), for a
machine where `transformers` is installed (it is not a test dependency: the tests use doctor_models.py's models of
the same architecture).

    python tests/diagnose/huggingface_check.py

Prints, for each model: the training doctor's findings over 5 Adam steps and tt.diagnose's findings after them
(a healthy run: none), then a seeded fault (BERT's pooler weights x50: a saturated tanh, named at its line in
modeling_bert.py), then a table of seeded faults on BERT: what the doctor says, and what
torch.autograd.detect_anomaly says on the same fault in plain torch.
"""
import copy
import warnings

import torch
from torch import nn
from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel

import torchtrace as tt


def tiny_bert(eps: float = 1e-12) -> nn.Module:
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(
        vocab_size=30, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        attn_implementation="eager", layer_norm_eps=eps))


def models():
    bert = tiny_bert()
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=30, n_embd=16, n_layer=2, n_head=2, n_positions=16, resid_pdrop=0.0,
                                      embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager",
                                      bos_token_id=0, eos_token_id=0))
    return tt.port(bert), tt.port(gpt2)


IDS = torch.randint(0, 30, (4, 8), generator=torch.Generator().manual_seed(0))
LABELS = torch.tensor([0, 1, 2, 0])


def _anomaly(loss) -> str:
    try:
        with torch.autograd.detect_anomaly():
            value = loss()
            value.backward()
    except RuntimeError as error:
        return f"RuntimeError: {str(error).splitlines()[0]}"
    return f"no error (loss {float(value.detach()):.4g})"


def _said(d) -> str:
    f = d.alarms[0] if d.alarms else None
    if f is None:
        return "no alarm"
    where = " ".join(p for p in (f.rule, f"in {f.module}" if f.module else "", f"at {f.line}") if p)
    return f"[{f.kind}, {f.phase}] {where}: {f.message}"


def _eps_zero(port: bool):
    model = tiny_bert(eps=0.0)
    with torch.no_grad():  # token IDS[0, 0] at position 0 with token type 0: an embedding row of zeros
        embeddings = model.bert.embeddings
        for table, row in ((embeddings.word_embeddings, IDS[0, 0]), (embeddings.position_embeddings, 0),
                           (embeddings.token_type_embeddings, 0)):
            table.weight[row] = 0.0
    model = tt.port(model) if port else model
    return lambda: model(input_ids=IDS, labels=LABELS).loss


def _standardised(port: bool):
    model = tiny_bert()
    rows = model.bert.embeddings.word_embeddings.weight.detach()[IDS].clone()
    rows[1, 3] = 0.0  # a blank token
    model = tt.port(model) if port else model

    def loss():
        x = (rows - rows.mean(-1, keepdim=True)) / rows.std(-1, keepdim=True)  # no eps: records nothing
        return model(inputs_embeds=x, labels=LABELS).loss
    return loss


class _Head(nn.Module):
    """A classifier on HuggingFace's BertModel, cut off by `.data` or by torch.no_grad() around the encoder."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.encoder, self.head, self.how = tiny_bert().bert, nn.Linear(16, 3), how

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.how == ".data":
            h = self.encoder(input_ids=ids).last_hidden_state.data
        else:
            with torch.no_grad():
                h = self.encoder(input_ids=ids).last_hidden_state
        return nn.functional.cross_entropy(self.head(h[:, 0]), LABELS)


def seeded() -> None:
    """Seeded faults on HuggingFace's BERT: the doctor's first alarm (or tool's answer) and anomaly mode's."""
    print("| fault | tt.diagnose says | torch.autograd.detect_anomaly says |\n|---|---|---|")
    for name, make in (("layer_norm_eps=0, a constant embedding row", _eps_zero),
                       ("inputs_embeds standardised by hand, a blank token", _standardised)):
        print(f"| {name} | {_said(tt.diagnose(make(True)))} | {_anomaly(make(False))} |")
    for how in (".data", "torch.no_grad()"):
        torch.manual_seed(0)
        model = tt.port(_Head(how))
        cut = tt.diagnose(lambda: model(IDS)).of_kind("no_path")[0]
        torch.manual_seed(0)
        plain = _Head(how)
        print(f"| {how} around BertModel | [no_path] at {cut.line}: ...{cut.message[-120:]} | "
              f"{_anomaly(lambda: plain(IDS))} |")
    model = tt.port(tiny_bert())
    twin = copy.deepcopy(model)
    report = tt.diff(lambda: model(input_ids=IDS, labels=LABELS).loss, lambda: twin(input_ids=IDS, labels=LABELS).loss)
    print(f"| tt.diff of a deepcopy | same: {report.same}, {len(report.leaf_divergences)} leaf divergences | - |")
    model(input_ids=IDS, labels=LABELS).loss.backward()
    flow = tt.flow(model)
    print(f"| tt.flow after backward | zero by construction: {', '.join(flow.with_flag('zero by construction'))}; "
          f"vanishing: {len(flow.with_flag('vanishing'))} | - |")


def main() -> None:
    warnings.filterwarnings("ignore")
    bert, gpt2 = models()
    ids = torch.randint(0, 30, (4, 8), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(4, 8, dtype=torch.long)
    mask[1, 6:] = 0
    labels = torch.tensor([0, 1, 2, 0])
    losses = {"bert": lambda: bert(input_ids=ids, attention_mask=mask, labels=labels).loss,
              "gpt2": lambda: gpt2(input_ids=ids, attention_mask=mask, labels=ids).loss}
    for name, model in (("bert", bert), ("gpt2", gpt2)):
        optimizer = tt.optim.Adam(model.parameters(), lr=1e-3)
        with tt.diagnose.training(model, optimizer) as doctor:
            for _ in range(5):
                optimizer.zero_grad()
                losses[name]().backward()
                optimizer.step()
        print(f"{name}: training doctor findings: {len(doctor.findings)}")
        print(f"{name}: {tt.diagnose(losses[name]).summary()}")
    with torch.no_grad():
        bert.bert.pooler.dense.weight.mul_(50.0)
    print(tt.diagnose(losses["bert"]))
    seeded()


if __name__ == "__main__":
    main()
