"""validation.py on a hand-made held-out shard: every number written out by hand.

The shard (S = 8, P = 3 prediction slots a row; ids: [PAD] 0, [CLS] 2, [SEP] 3, [MASK] 4, `<` 10, `un` 11,
`##k` 12, `>` 13, words 20-29):

    row 0, original  [CLS] 20 21 22 23 [SEP] [PAD] [PAD]
           input     [CLS] 20  M 22  M [SEP]               slots: 2 -> 21 ([MASK]), 3 -> 22 (kept), 4 -> 23 ([MASK])
    row 1, original  [CLS] <  un ##k >  24 [SEP] [PAD]     (WikiText's `<unk>` as four pieces)
           input     [CLS] <   M ##k >   M [SEP]           slots: 2 -> 11 ([MASK], inside <unk>), 5 -> 24 ([MASK])

The stand-in model guesses, at a slot p, "the input token at p - 1, plus one" when that token is a word (20-29),
else 29; it scores its guess 10 and every other id 0 (V = 32).

With the context: slot (0,2) sees 20 -> 21 right; (0,3) sees [MASK] -> 29 wrong; (0,4) sees the kept 22 -> 23 right;
(1,2) sees `<` -> 29 wrong; (1,5) sees `>` -> 29 wrong. Over every slot 2/5 right. The [MASK]ed slots less the one
inside `<unk>` are (0,2), (0,4), (1,5): 2/3 right.
Without the context every real token but [CLS]/[SEP] is [MASK], so every guess is 29: 0/3. Context gain 2/3.
Targets 21, 22, 23, 11, 24 are all different: unigram entropy ln 5; always guessing the commonest target of the
three [MASK]ed slots (21, 23, 24: a tie, any one) is right at 1 of 3.
Loss: a right guess costs ln(e^10 + 31) - 10, a wrong one ln(e^10 + 31); two right, three wrong.
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import subprocess_env
from slurm_cluster import free_port

from bert_recipe.pretraining.validation import SpecialIds, Validator, span_mask, strip_context, unigram_entropy
from bert_recipe.training import dist_env

PAD, CLS, SEP, MASK, V = 0, 2, 3, 4, 32
VOCAB = {"[PAD]": PAD, "[CLS]": CLS, "[SEP]": SEP, "[MASK]": MASK, "<": 10, "un": 11, "##k": 12, ">": 13}


def hand_made_shard() -> dict[str, np.ndarray]:
    return {
        "input_ids": np.array(
            [[CLS, 20, MASK, 22, MASK, SEP, PAD, PAD], [CLS, 10, MASK, 12, 13, MASK, SEP, PAD]], dtype=np.int32
        ),
        "input_mask": np.array([[1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1, 0]], dtype=np.int8),
        "segment_ids": np.zeros((2, 8), dtype=np.int8),
        "masked_lm_positions": np.array([[2, 3, 4], [2, 5, 0]], dtype=np.int32),
        "masked_lm_ids": np.array([[21, 22, 23], [11, 24, 0]], dtype=np.int32),
        "next_sentence_labels": np.array([0, 1], dtype=np.int8),
    }


class LeftNeighbourPlusOne(torch.nn.Module):
    """At slot p: guess input[p - 1] + 1 when it is a word (20-29), else 29; score 10 for the guess, 0 elsewhere."""

    def forward(self, input_ids, masked_lm_positions, **_):
        left = torch.gather(input_ids, 1, (masked_lm_positions - 1).clamp(min=0))  # [B, P] (unused slots: [CLS])
        guess = torch.where((left >= 20) & (left <= 29), left + 1, torch.full_like(left, 29))
        scores = torch.zeros(*guess.shape, V)
        scores.scatter_(2, guess.unsqueeze(-1), 10.0)
        return SimpleNamespace(prediction_scores=scores)


def test_the_numbers_written_out_by_hand():
    validator = Validator(
        hand_made_shard(),
        SpecialIds.from_vocab(VOCAB),
        batch_size=1,
        autocast=contextlib.nullcontext,
        env=dist_env.DistEnv(),
    )
    result = validator(LeftNeighbourPlusOne())
    right, wrong = math.log(math.exp(10) + 31) - 10, math.log(math.exp(10) + 31)
    assert result["eval_masked_positions"] == 5 and result["eval_mask_slots"] == 3
    assert result["eval_mlm_accuracy"] == pytest.approx(2 / 5)
    assert result["eval_mlm_loss"] == pytest.approx((2 * right + 3 * wrong) / 5)
    assert result["eval_unigram_entropy"] == pytest.approx(math.log(5))
    assert result["eval_mask_accuracy"] == pytest.approx(2 / 3)
    assert result["eval_mask_accuracy_without_context"] == 0
    assert result["eval_context_gain"] == pytest.approx(2 / 3)
    # The [MASK]ed slots' targets 21, 23, 24 are all different: the commonest one is right at 1 slot of 3.
    assert result["eval_mask_accuracy_most_frequent"] == pytest.approx(1 / 3)


def test_without_the_vocabulary_the_ids_come_from_the_shard_and_unk_pieces_count():
    special = SpecialIds.from_shards(hand_made_shard())
    assert (special.cls, special.sep, special.mask, special.unk_pieces) == (CLS, SEP, MASK, None)
    validator = Validator(hand_made_shard(), special, 2, contextlib.nullcontext, dist_env.DistEnv())
    result = validator(LeftNeighbourPlusOne())
    # Now the slot inside `<unk>` counts: 4 [MASK]ed slots, still 2 right with the context, 0 without.
    assert result["eval_mask_slots"] == 4 and result["eval_mask_accuracy"] == pytest.approx(2 / 4)
    assert result["eval_context_gain"] == pytest.approx(2 / 4)
    assert result["eval_mask_accuracy_most_frequent"] == pytest.approx(1 / 4)


def test_helpers_on_written_out_rows():
    ids = np.array([[2, 10, 11, 12, 13, 10, 11, 12, 13, 3], [2, 10, 11, 12, 20, 13, 3, 0, 0, 0]])
    covered = span_mask(ids, (10, 11, 12, 13))
    assert covered[0].tolist() == [False] + [True] * 8 + [False] and not covered[1].any()  # row 1: no whole span
    mask = (ids > 0).astype(np.int8)
    assert strip_context(ids, mask, SpecialIds(CLS, SEP, MASK)).tolist() == [
        [2, 4, 4, 4, 4, 4, 4, 4, 4, 3],
        [2, 4, 4, 4, 4, 4, 3, 0, 0, 0],
    ]
    # -(1/2 ln 1/2 + 2 * 1/4 ln 1/4) = 1.5 ln 2
    assert unigram_entropy(np.array([7, 7, 8, 9])) == pytest.approx(1.5 * math.log(2))


def test_held_out_shards_without_masks_are_refused():
    shard = hand_made_shard()
    shard["masked_lm_positions"][:] = 0
    with pytest.raises(ValueError, match="static masks"):
        Validator(shard, SpecialIds(CLS, SEP, MASK), 2, contextlib.nullcontext, dist_env.DistEnv())


RANK_WORKER = """
import contextlib, json, sys
import torch
sys.path.insert(0, {tests!r})
from bert_recipe.training import dist_env
from test_validation import LeftNeighbourPlusOne, VOCAB, hand_made_shard
from bert_recipe.pretraining.validation import SpecialIds, Validator
torch.distributed.init_process_group("gloo")
rank = torch.distributed.get_rank()
mine = {{k: v[rank:rank + 1] for k, v in hand_made_shard().items()}}  # rank r holds row r
env = dist_env.DistEnv(rank=rank, world_size=2)
result = Validator(mine, SpecialIds.from_vocab(VOCAB), 1, contextlib.nullcontext, env)(LeftNeighbourPlusOne())
print(json.dumps(result))
torch.distributed.barrier()
torch.distributed.destroy_process_group()
"""


def test_two_ranks_holding_a_row_each_give_the_one_process_numbers(tmp_path):
    """Every number is a sum over the ranks: two gloo processes, row 0 on rank 0 and row 1 on rank 1, report what
    one process with both rows reports (written out above)."""
    port = free_port()  # below the ephemeral range, as every MASTER_PORT of the suite (slurm_cluster.free_port)
    script = RANK_WORKER.format(tests=str(Path(__file__).parent))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={
                **subprocess_env(),
                "RANK": str(r),
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            },
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    for out, _ in outs:
        result = json.loads(out.strip().splitlines()[-1])
        assert result["eval_masked_positions"] == 5 and result["eval_mask_slots"] == 3
        assert result["eval_mask_accuracy"] == pytest.approx(2 / 3)
        assert result["eval_context_gain"] == pytest.approx(2 / 3)
        assert result["eval_unigram_entropy"] == pytest.approx(math.log(5))
        assert result["eval_mask_accuracy_most_frequent"] == pytest.approx(1 / 3)
