"""The doctor on HuggingFace's own BERT and GPT-2 classes (tiny configs built here, nothing downloaded), for a
machine where `transformers` is installed (it is not a test dependency: the tests use doctor_models.py's models of
the same architecture).

    python tests/diagnose/huggingface_check.py

Prints, for each model: the training doctor's findings over 5 Adam steps and tt.diagnose's findings after them
(a healthy run: none), then a seeded fault (BERT's pooler weights x50: a saturated tanh, named at its line in
modeling_bert.py).
"""
import warnings

import torch
from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel

import torchtrace as tt


def models():
    torch.manual_seed(0)
    bert = BertForSequenceClassification(BertConfig(
        vocab_size=30, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        attn_implementation="eager"))
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=30, n_embd=16, n_layer=2, n_head=2, n_positions=16, resid_pdrop=0.0,
                                      embd_pdrop=0.0, attn_pdrop=0.0, attn_implementation="eager",
                                      bos_token_id=0, eos_token_id=0))
    return tt.port(bert), tt.port(gpt2)


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


if __name__ == "__main__":
    main()
