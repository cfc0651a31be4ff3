"""The GPT's vocabulary padding and the loss it computes itself (inside a compiled graph)."""

import pytest
import torch
from torch.nn import functional as F

from hpctrain.train.models.gpt import GPT


def _model(pad: int) -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=32, vocab_pad_to=pad)


def test_vocab_padding_rounds_the_embedding_and_head_up():
    assert _model(64).tok_emb.weight.shape == (64, 32)
    assert _model(16).head.weight.shape == (64, 32)
    assert _model(1).tok_emb.weight.shape == (50, 32)
    assert GPT(50257, 8, 1, 1, 8, vocab_pad_to=64).tok_emb.num_embeddings == 50304  # nanoGPT's figure
    with pytest.raises(ValueError, match="model.vocab_pad_to=0: expected an integer >= 1"):
        _model(0)


@pytest.mark.parametrize("pad", [1, 64])
def test_logits_cover_the_real_vocabulary_and_the_model_loss_matches(pad):
    model = _model(pad)
    idx = torch.randint(0, 50, (3, 16))
    targets = torch.randint(0, 50, (3, 16))
    logits = model(idx)
    assert logits.shape == (3, 16, 50)
    same_logits, loss = model(idx, targets)
    assert torch.equal(same_logits, logits) and loss.dtype == torch.float32
    expected = F.cross_entropy(logits.reshape(-1, 50), targets.reshape(-1))
    assert torch.allclose(loss, expected, atol=1e-6)  # the padding takes no probability mass


def test_compiled_model_computes_its_loss_in_fp32_under_bf16_autocast():
    model = _model(64)
    compiled = torch.compile(model)
    idx, targets = torch.randint(0, 50, (2, 16)), torch.randint(0, 50, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = compiled(idx, targets)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert model.tok_emb.weight.grad is not None
