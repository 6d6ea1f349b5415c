"""bit_dropout.BitMaskDropout (run_pretraining.py --bit_dropout_masks, bit_dropout.convert) against the written-out
formula of dropout and against torch's own dropout: the same outputs and gradients for the mask it draws, an eighth
of the bytes saved for the backward, the configured keep rate, and a model that trains the same way in eval and
learns in training."""

from __future__ import annotations

import pytest
import torch
from helpers import bert_config

from bert_recipe.training import bit_dropout
from modeling import BertForPreTraining


@pytest.mark.parametrize("shape", [(3, 5), (2, 7, 16), (1,)])
def test_bits_round_trip_any_size(shape):
    mask = torch.rand(shape, generator=torch.Generator().manual_seed(1)) < 0.5
    packed = bit_dropout.pack_bits(mask)
    assert packed.dtype == torch.uint8 and packed.numel() == -(-mask.numel() // 8)
    assert torch.equal(bit_dropout.unpack_bits(packed, mask.shape), mask)
    first = int(packed[0])  # element i is bit i % 8 of byte i // 8
    assert [(first >> i) & 1 for i in range(min(8, mask.numel()))] == mask.reshape(-1)[:8].int().tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_outputs_and_gradients_are_dropouts_formula_for_its_mask(dtype):
    """y = x * keep / (1 - p) and dx = dy * keep / (1 - p), keep = (uniform draw >= p) from the same RNG state."""
    p = 0.1
    x = torch.randn(6, 40, dtype=dtype, requires_grad=True)
    grad = torch.randn(6, 40, dtype=dtype)
    torch.manual_seed(3)
    y = bit_dropout.BitMaskDropout(p).train()(x)
    y.backward(grad)
    torch.manual_seed(3)
    keep = torch.rand_like(x, dtype=torch.float32) >= p
    torch.testing.assert_close(y, x.detach() * keep / (1 - p), rtol=0, atol=0)
    torch.testing.assert_close(x.grad, grad * keep / (1 - p), rtol=0, atol=0)
    assert y.dtype == dtype and 0 < int((~keep).sum()) < keep.numel()
    assert torch.equal(bit_dropout.BitMaskDropout(p).eval()(x), x)


def saved_bytes(module: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes autograd keeps for the backward of module(x), beyond x itself."""
    saved = []

    def pack(t):
        if t.data_ptr() != x.data_ptr():
            saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module.train()(x)
    return sum(saved)


class NativeDropout(torch.nn.Module):
    """What nn.Dropout runs on a GPU and what Inductor decomposes dropout into: aten::native_dropout, whose backward
    keeps a bool mask (on the CPU nn.Dropout keeps a float scale instead)."""

    def forward(self, x):
        return torch.native_dropout(x, 0.1, True)[0]


def test_the_mask_kept_for_the_backward_is_an_eighth_of_torchs():
    x = torch.randn(64, 1024, requires_grad=True)
    ours, torchs = saved_bytes(bit_dropout.BitMaskDropout(0.1), x), saved_bytes(NativeDropout(), x)
    assert torchs == x.numel()  # a byte an element
    assert ours * 8 == torchs


def test_the_keep_rate_is_one_minus_p():
    x = torch.ones(1000, 1000)
    y = bit_dropout.BitMaskDropout(0.1).train()(x)
    assert abs(float((y > 0).float().mean()) - 0.9) < 0.002  # 1e6 draws: 6 standard deviations is 0.0018
    assert torch.allclose(y[y > 0], torch.tensor(1 / 0.9))


def test_a_bert_with_bit_masks_equals_torchs_in_eval_and_learns_in_training():
    torch.manual_seed(0)
    plain = BertForPreTraining(bert_config(hidden_dropout_prob=0.1))
    bits = BertForPreTraining(bert_config(hidden_dropout_prob=0.1))
    layers = bits.config.num_hidden_layers
    assert bit_dropout.convert(bits) == 1 + 2 * layers  # the embeddings' and two a layer; not the classifier heads'
    assert sum(isinstance(m, bit_dropout.BitMaskDropout) for m in bits.modules()) == 1 + 2 * layers
    assert bit_dropout.convert(bits) == 0  # nothing left to swap
    bits.load_state_dict(plain.state_dict())  # the same state dict: dropout has none
    ids = torch.randint(5, bits.config.vocab_size, (4, 16))
    labels = torch.where(torch.rand(4, 16) < 0.3, ids, -100)
    batch = {"input_ids": ids, "masked_lm_labels": labels, "next_sentence_labels": torch.tensor([0, 1, 0, 1])}
    torch.testing.assert_close(bits.eval()(**batch).loss, plain.eval()(**batch).loss, rtol=0, atol=0)
    optimizer = torch.optim.AdamW(bits.parameters(), lr=1e-3)
    bits.train()
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss = bits(**batch).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses  # one batch, memorised through the dropout
