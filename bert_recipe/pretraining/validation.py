"""The pre-training validator: held-out masked-LM numbers that say whether the model reads its context.

A masked-LM loss alone does not tell a model that learned word frequencies from one that reads the sentence: both
fall fast at first. So every evaluation reports, on held-out shards (static masks, as create_pretraining_data.py
writes them), these numbers (the JSON keys of run_pretraining.py's log):

  eval_mlm_loss            mean cross-entropy (nats) over every prediction slot: the 80% replaced by [MASK], the
                           10% replaced by a random token, the 10% kept
  eval_unigram_entropy     the entropy (nats) of those slots' targets' own frequencies: the loss of the best
                           context-free guesser, one that knows the held-out word frequencies exactly. A model that
                           only learned frequencies sits at it; one that reads the context goes below it
  eval_mlm_accuracy        accuracy over every prediction slot (the kept 10% can be copied from the input, so this
                           rises without any use of the context)
  eval_mask_accuracy       accuracy over the [MASK]ed slots only, where nothing can be copied
  eval_mask_accuracy_without_context
                           the same slots, with every other token of the input replaced by [MASK] too ([CLS], [SEP]
                           and padding kept): what the model gets from positions and frequencies alone
  eval_context_gain        eval_mask_accuracy - eval_mask_accuracy_without_context: what the context is worth
  eval_mask_accuracy_most_frequent
                           the same slots, always guessing their commonest target: the context-free guess that
                           eval_mask_accuracy must beat. Early in training the gain can be positive with
                           eval_mask_accuracy still at this level: the guesses without context got worse (a row of
                           [MASK]s is unlike anything trained on), not the use of the context better
  eval_mask_slots          the [MASK]ed slots counted (all ranks)

Slots whose target is a piece of WikiText's `<unk>` placeholder (`<` `un` `##k` `>`, four pieces that predict
each other) are left out of the [MASK] accuracies when the vocabulary is known, so that the context gain measures
language, not the placeholder. The special ids come from --vocab_file, or else from the shards themselves (the
token at position 0 is [CLS], the one at most prediction slots is [MASK], the last real one [SEP]).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from bert_recipe.pretraining.data_stream import to_model_inputs, unmask

UNK_PLACEHOLDER = ("<", "un", "##k", ">")  # how BERT's WordPiece spells WikiText's `<unk>`


@dataclass(frozen=True)
class SpecialIds:
    cls: int
    sep: int
    mask: int
    pad: int = 0
    unk_pieces: tuple[int, ...] | None = None  # the ids of UNK_PLACEHOLDER, when the vocabulary is known

    @classmethod
    def from_vocab(cls, vocab: dict[str, int]) -> SpecialIds:
        pieces = tuple(vocab[p] for p in UNK_PLACEHOLDER) if all(p in vocab for p in UNK_PLACEHOLDER) else None
        return cls(vocab["[CLS]"], vocab["[SEP]"], vocab["[MASK]"], vocab.get("[PAD]", 0), pieces)

    @classmethod
    def from_shards(cls, arrays: dict[str, np.ndarray]) -> SpecialIds:
        """Read off static-masked shards: [CLS] opens every row, [MASK] is the commonest token at the prediction
        slots (80% of them), [SEP] the commonest last real token."""
        input_ids, positions = arrays["input_ids"], arrays["masked_lm_positions"]
        rows, slots = np.nonzero(positions > 0)
        at_slots = input_ids[rows, positions[rows, slots]]
        last = input_ids[np.arange(len(input_ids)), np.maximum(arrays["input_mask"].sum(1) - 1, 0)]
        mode = lambda x: int(np.bincount(x.astype(np.int64)).argmax())  # noqa: E731
        return cls(mode(input_ids[:, 0]), mode(last), mode(at_slots))


def unigram_entropy(targets: np.ndarray) -> float:
    """-sum_t p(t) ln p(t) over the empirical distribution of `targets` (nats)."""
    return entropy_of_counts(np.bincount(np.asarray(targets, dtype=np.int64).ravel()))


def entropy_of_counts(counts: np.ndarray) -> float:
    """The entropy (nats) of the distribution counts / counts.sum()."""
    counts = np.asarray(counts, dtype=np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def span_mask(ids: np.ndarray, pattern: tuple[int, ...]) -> np.ndarray:
    """[N, S] bool: True at every token of every occurrence of `pattern` (consecutive ids) in the rows of `ids`."""
    n = len(pattern)
    hits = np.ones((ids.shape[0], ids.shape[1] - n + 1), dtype=bool)
    for i, token in enumerate(pattern):  # starts where the i-th id of the pattern follows
        hits &= ids[:, i : ids.shape[1] - n + 1 + i] == token
    covered = np.zeros(ids.shape, dtype=bool)
    for i in range(n):
        covered[:, i : ids.shape[1] - n + 1 + i] |= hits
    return covered


def strip_context(input_ids: np.ndarray, input_mask: np.ndarray, special: SpecialIds) -> np.ndarray:
    """[N, S]: every real token but [CLS] and [SEP] replaced by [MASK] (padding kept): the input without context."""
    keep = (input_mask == 0) | (input_ids == special.cls) | (input_ids == special.sep)
    return np.where(keep, input_ids, special.mask).astype(input_ids.dtype)


def mask_slots(arrays: dict[str, np.ndarray], special: SpecialIds) -> np.ndarray:
    """[N, P] bool: prediction slots whose input token is [MASK], less those inside a `<unk>` placeholder."""
    positions = arrays["masked_lm_positions"]
    used = positions > 0  # position 0 is [CLS], never masked: 0 marks an unused slot
    at = np.take_along_axis(arrays["input_ids"], positions, 1)  # [N, P] the input token at each slot
    slots = used & (at == special.mask)
    if special.unk_pieces is not None:
        original = unmask(arrays["input_ids"], positions, arrays["masked_lm_ids"])  # [N, S] before masking
        inside = np.take_along_axis(span_mask(original, special.unk_pieces), positions, 1)  # [N, P]
        slots &= ~inside
    return slots


def most_frequent_share(counts: np.ndarray) -> float:
    """The accuracy of always guessing the commonest target, from how often each target occurs (`counts`): the
    context-free floor eval_mask_accuracy_most_frequent reports for the [MASK]ed slots."""
    return float(counts.max(initial=0) / max(counts.sum(), 1))


def heldout_most_frequent(arrays: dict[str, np.ndarray], special: SpecialIds) -> float:
    """eval_mask_accuracy_most_frequent of a whole held-out set read in one process (`arrays`: input_ids,
    masked_lm_positions, masked_lm_ids, as data_stream.load_eval_set reads them): always guessing the commonest
    target of the [MASK]ed slots (mask_slots). What the CPU demo's summary and bench's studies print as the baseline."""
    return most_frequent_share(np.bincount(arrays["masked_lm_ids"][mask_slots(arrays, special)].astype(np.int64)))


class Validator:
    """Evaluates a BertForPreTraining on a held-out set (this rank's rows of it): see the module docstring.

    eval_set: arrays as data_stream.load_eval_set returns them (static masks); batch_size: sequences per
    forward pass; autocast: a context manager factory for the forward passes (the run's precision); env: the
    distributed environment (sums are all-reduced over the ranks)."""

    def __init__(self, eval_set: dict[str, np.ndarray], special: SpecialIds, batch_size: int, autocast, env):
        if not (eval_set["masked_lm_positions"] > 0).any():
            raise ValueError(
                "the held-out shards have no masked positions: write them with static masks "
                "(create_pretraining_data.py without --no_static_masking)"
            )
        self.arrays, self.batch_size, self.autocast, self.env = eval_set, batch_size, autocast, env
        self.special = special
        self.slots = mask_slots(eval_set, special)  # [N, P]
        self.stripped = {**eval_set, "input_ids": strip_context(eval_set["input_ids"], eval_set["input_mask"], special)}
        # Both context-free references are of the whole held-out set: every rank's counts added up once.
        targets = eval_set["masked_lm_ids"][eval_set["masked_lm_positions"] > 0]  # every prediction slot's
        self.entropy = entropy_of_counts(self._counts(targets))
        self.most_frequent = most_frequent_share(self._counts(eval_set["masked_lm_ids"][self.slots]))

    def _counts(self, targets: np.ndarray) -> np.ndarray:
        """How often each id occurs among `targets`, summed over the ranks."""
        counts = torch.from_numpy(np.bincount(targets.astype(np.int64), minlength=int(targets.max(initial=0)) + 1))
        if self.env.distributed:
            size = torch.tensor([len(counts)])
            torch.distributed.all_reduce(size, op=torch.distributed.ReduceOp.MAX)
            counts = torch.nn.functional.pad(counts, (0, int(size) - len(counts))).to(self.env.device)
            torch.distributed.all_reduce(counts)
        return counts.cpu().numpy()

    @torch.no_grad()
    def _scores(self, model, arrays: dict[str, np.ndarray], start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Scores [B, P, V] of one batch's prediction slots, and their targets [B, P]."""
        batch = {
            k: v.to(self.env.device) for k, v in to_model_inputs(arrays, slice(start, start + self.batch_size)).items()
        }
        with self.autocast():
            scores = model(**batch).prediction_scores.float()  # [B, P, V]: every prediction slot
        return scores, batch["masked_lm_ids"]

    @torch.no_grad()
    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        was_training = model.training
        model.eval()
        device = self.env.device
        # correct, slots, loss sum (every slot); correct with, correct without context, slots ([MASK] only)
        sums = torch.zeros(6, dtype=torch.float64, device=device)
        for start in range(0, len(self.arrays["input_ids"]), self.batch_size):
            rows = slice(start, start + self.batch_size)
            used = torch.from_numpy(self.arrays["masked_lm_positions"][rows] > 0).to(device)  # [B, P]
            slots = torch.from_numpy(self.slots[rows]).to(device)  # [B, P]
            scores, labels = self._scores(model, self.arrays, start)
            guess = scores.argmax(-1)  # [B, P]
            bare = self._scores(model, self.stripped, start)[0].argmax(-1)  # [B, P] without the context
            loss = torch.nn.functional.cross_entropy(scores[used], labels[used], reduction="sum")
            sums += torch.stack(
                [
                    (guess == labels)[used].sum(),
                    used.sum(),
                    loss,
                    (guess == labels)[slots].sum(),
                    (bare == labels)[slots].sum(),
                    slots.sum(),
                ]
            ).double()
        if self.env.distributed:
            torch.distributed.all_reduce(sums)
        model.train(was_training)
        correct, count, loss, with_context, without_context, mask_count = sums.tolist()
        with_context, without_context = with_context / max(mask_count, 1), without_context / max(mask_count, 1)
        return {
            "eval_mlm_accuracy": correct / max(count, 1),
            "eval_mlm_loss": loss / max(count, 1),
            "eval_masked_positions": int(count),
            "eval_unigram_entropy": self.entropy,
            "eval_mask_accuracy": with_context,
            "eval_mask_accuracy_without_context": without_context,
            "eval_context_gain": with_context - without_context,
            "eval_mask_accuracy_most_frequent": self.most_frequent,
            "eval_mask_slots": int(mask_count),
        }


def describe(result: dict[str, float]) -> str:
    """One line a person reads: loss against the unigram entropy, and the context gain in points."""
    below = result["eval_unigram_entropy"] - result["eval_mlm_loss"]
    return (
        f"held-out masked-LM loss {result['eval_mlm_loss']:.3f} nats, unigram entropy of its targets "
        f"{result['eval_unigram_entropy']:.3f} ({below:.3f} nats below it); context gain "
        f"{100 * result['eval_context_gain']:+.1f} points ([MASK]ed slots: {result['eval_mask_accuracy']:.3f} "
        f"with the context, {result['eval_mask_accuracy_without_context']:.3f} without, "
        f"{result['eval_mask_accuracy_most_frequent']:.3f} always guessing the commonest word)"
    )
