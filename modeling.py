"""BERT in plain PyTorch: the architecture alone.

Read top to bottom: BertConfig -> embeddings -> self-attention -> feed-forward -> layer -> encoder -> pooler ->
BertModel -> heads (pre-training, question answering, sequence classification, multiple choice) -> the named
tuples every forward returns -> parameter and FLOP counts.

The architecture is the original post-LayerNorm BERT. Parameter names are Hugging Face's
(`bert.encoder.layer.0.attention.self.query.weight`, `cls.predictions.bias`, ...): checkpoint_io.py reads
checkpoints of `transformers`, NVIDIA's DeepLearningExamples and this project into these classes
(`checkpoint_io.from_pretrained(BertForQuestionAnswering, path)`) and writes them back out.

Notation in shape comments: B batch, S sequence length, H hidden size, N heads, D head size (H / N),
I intermediate size, V vocabulary size (padded), M number of masked (predicted) positions in the batch,
P prediction slots per sequence (fixed-slot head; per row for packed rows), T real (non-padding) tokens of the
batch, K sequences a row (sequence packing).

The speed path lives beside it, pure PyTorch, in the only two modules of ours imported here: bert_padding.py
(unpadding, sequence packing's layout, the fixed-slot masked-LM gather) and bert_attention.py (the attention
kernels and the rule that picks one). How a model runs, as opposed to what it is, is not in BertConfig (which a
checkpoint saves): unpadding and the variable-length kernel are attributes a run sets (`set_execution`), and speed
paths no GPU has yet shown to win are applied from outside (bert_recipe/training/: fp8.py, bit_dropout.py,
cuda_graphs.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from bert_attention import KERNELS, sdpa, varlen_attention
from bert_padding import Packed, Unpadded, gather_indexes, has_padding, packed_layout, pad, unpad, unpad_info

# ----------------------------------------------------------------------------------------------------------------
# Configuration


@dataclass
class BertConfig:
    """The hyper-parameters of a BERT model; the JSON keys are those of Google's bert_config.json and of
    Hugging Face's config.json."""

    vocab_size: int = 30522
    """Tokens in the vocabulary file (the true size; see pad_vocab_size_multiple)."""
    hidden_size: int = 768
    """Width H of every token representation."""
    num_hidden_layers: int = 12
    """Transformer layers in the encoder."""
    num_attention_heads: int = 12
    """Attention heads per layer; must divide hidden_size."""
    intermediate_size: int = 3072
    """Width of the feed-forward layer (4 H in the published models)."""
    hidden_act: str = "gelu"
    """Feed-forward activation: gelu (exact, erf), gelu_new / gelu_tanh (tanh approximation), relu, silu."""
    hidden_dropout_prob: float = 0.1
    """Dropout on embeddings and on every sub-layer output."""
    attention_probs_dropout_prob: float = 0.1
    """Dropout on the attention probabilities."""
    max_position_embeddings: int = 512
    """Longest sequence the learned position embeddings cover."""
    type_vocab_size: int = 2
    """Segment (token type) ids: 0 for sentence A, 1 for sentence B."""
    initializer_range: float = 0.02
    """Standard deviation of the normal initialisation of every weight matrix."""
    layer_norm_eps: float = 1e-12
    """LayerNorm epsilon (1e-12 in the original, not PyTorch's 1e-5)."""
    pad_vocab_size_multiple: int = 1
    """Pad the embedding and output rows to a multiple of this (8 for tensor cores); exports keep vocab_size."""

    _ACTIVATIONS = ("gelu", "bias_gelu", "gelu_new", "gelu_tanh", "gelu_pytorch_tanh", "relu", "silu", "swish")

    def __post_init__(self):
        self.validate()

    @property
    def padded_vocab_size(self) -> int:
        m = max(1, self.pad_vocab_size_multiple)
        return ((self.vocab_size + m - 1) // m) * m

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def validate(self, source: str = "BertConfig") -> None:
        """Raise a one-line ValueError naming the first bad field."""
        positive = (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
            "pad_vocab_size_multiple",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{source}: {name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"{source}: hidden_size ({self.hidden_size}) must be divisible by "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{source}: {name} must be in [0, 1), got {getattr(self, name)!r}")
        if self.hidden_act not in self._ACTIVATIONS:
            raise ValueError(f"{source}: hidden_act {self.hidden_act!r} is not one of {self._ACTIVATIONS}")

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "config") -> "BertConfig":
        """Build from a Google/NVIDIA/Hugging Face config dict; keys this model does not use are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in names}
        if "vocab_size" not in kwargs:
            raise ValueError(f"{source}: no vocab_size key; is this a BERT config file?")
        config = cls.__new__(cls)
        defaults = cls()
        for f in dataclasses.fields(cls):
            setattr(config, f.name, kwargs.get(f.name, getattr(defaults, f.name)))
        config.validate(source)
        return config

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> "BertConfig":
        if not os.path.isfile(path):
            raise FileNotFoundError(f"config file {path} not found: pass --config_file with a bert_config.json")
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"config file {path} is not valid JSON ({e}): pass a bert_config.json") from None
        except UnicodeDecodeError as e:
            raise ValueError(
                f"config file {path} is not UTF-8 JSON text (byte {e.start}): pass a bert_config.json"
            ) from None
        if not isinstance(d, dict):
            raise ValueError(
                f"config file {path} holds a JSON {type(d).__name__}, not an object: pass a bert_config.json"
            )
        return cls.from_dict(d, source=str(path))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if d["pad_vocab_size_multiple"] == 1:  # keep Google's key set unless padding is asked for
            del d["pad_vocab_size_multiple"]
        return d

    def to_json_file(self, path: str | os.PathLike) -> None:
        """A bert_config.json (Google's keys). Checkpoints carry their config themselves (checkpoint_io.py)."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps(self.to_dict(), indent=2) + "\n")


def _activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name in ("gelu", "bias_gelu"):
        return F.gelu  # exact erf GELU, as the original
    if name in ("gelu_new", "gelu_tanh", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    return F.silu  # silu / swish


# ----------------------------------------------------------------------------------------------------------------
# The encoder


class BertEmbeddings(nn.Module):
    """word + position + token-type embeddings, then LayerNorm and dropout. Takes [B, S] ids (with position_ids
    [B, S] for packed rows, whose positions restart in every sequence), or the real tokens' [T] ids with their
    position_ids [T] (the unpadded path)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.padded_vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)  # [S], broadcast over the batch
        x = (
            self.word_embeddings(input_ids)  # [B, S, H] (unpadded: [T, H])
            + self.position_embeddings(position_ids)  # [S, H] (unpadded: [T, H])
            + self.token_type_embeddings(token_type_ids)
        )  # [B, S, H] (unpadded: [T, H])
        return self.dropout(self.LayerNorm(x))  # [B, S, H] (unpadded: [T, H])


class BertSelfAttention(nn.Module):
    """Multi-head scaled dot-product attention through F.scaled_dot_product_attention, so that GPUs use the
    FlashAttention / memory-efficient kernels and CPUs the fused one. Names follow Hugging Face: query/key/value.

    Padded: x [B, S, H] with attn_mask [B, 1, 1, S] (packed rows: the block-diagonal [B, 1, S, S]; or None).
    Unpadded: x [T, H] (the real tokens) with an Unpadded description in place of the mask;
    bert_attention.varlen_attention picks the kernel (see there), by its rule or as `varlen_kernel` names one."""

    varlen_kernel: str = "auto"
    """The unpadded path's attention kernel: auto (bert_attention.choose_kernel's rule) or a name from
    bert_attention.KERNELS (a run's --varlen_kernel, through set_execution)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_size = config.head_size
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | Unpadded | None) -> torch.Tensor:
        # One GEMM for q, k and v instead of three: the weights are concatenated on the fly (3 H x H, small next
        # to the B*S x H activations), which keeps the checkpoint layout of three separate Linear layers.
        weight = torch.cat([self.query.weight, self.key.weight, self.value.weight])  # [3H, H]
        bias = torch.cat([self.query.bias, self.key.bias, self.value.bias])  # [3H]
        qkv = F.linear(x, weight, bias)  # [B, S, 3H] (unpadded: [T, 3H])
        dropout_p = self.dropout_p if self.training else 0.0
        if isinstance(attn_mask, Unpadded):
            T, H = x.shape  # T: the real tokens (a static layout's extra rows too)
            qkv = qkv.view(T, 3, self.num_heads, self.head_size)  # [T, 3, N, D]: split the 3H columns
            y = varlen_attention(qkv, attn_mask, dropout_p, self.varlen_kernel)  # [T, N, D]
            return y.reshape(T, H)  # [T, H]: the heads side by side again
        B, S, H = x.shape
        # Split the 3H columns into (q/k/v, head, head dim); SDPA wants the heads before the positions.
        qkv = qkv.view(B, S, 3, self.num_heads, self.head_size).permute(2, 0, 3, 1, 4)  # [3, B, N, S, D]
        q, k, v = qkv.unbind(0)  # each [B, N, S, D]
        y = sdpa(q, k, v, attn_mask, dropout_p)  # [B, N, S, D]
        return y.transpose(1, 2).reshape(B, S, H)  # [B, S, H]: the heads side by side again


class BertSelfOutput(nn.Module):
    """Attention output projection, dropout, residual, LayerNorm (post-LN)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | Unpadded | None) -> torch.Tensor:
        return self.output(self.self(x, attn_mask), x)


class BertIntermediate(nn.Module):
    """The first feed-forward layer and its activation: H -> I."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = _activation(config.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))  # [B, S, I] (unpadded: [T, I])


class BertOutput(nn.Module):
    """The second feed-forward layer I -> H, dropout, residual, LayerNorm."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class BertLayer(nn.Module):
    """Attention then feed-forward. Every op but attention is row-wise, so it runs on [T, H] unpadded."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | Unpadded | None) -> torch.Tensor:
        """Attention then feed-forward. Every op but attention is row-wise, so it runs on [T, H] unpadded."""
        x = self.attention(x, attn_mask)
        return self.output(self.intermediate(x), x)  # [B, S, H] (unpadded: [T, H])


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.checkpoint_activations = False
        """Recompute each layer's activations in the backward pass (less memory, ~30% more compute)."""

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | Unpadded | None, output_hidden_states: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The last layer's output [B, S, H] (unpadded: [T, H]); with output_hidden_states, (that, (input, layer 1,
        ..., layer L))."""
        hidden_states = [x] if output_hidden_states else None
        for layer in self.layer:
            if self.checkpoint_activations and self.training:
                x = checkpoint(layer, x, attn_mask, use_reentrant=False)
            else:
                x = layer(x, attn_mask)
            if hidden_states is not None:
                hidden_states.append(x)
        return (x, tuple(hidden_states)) if hidden_states is not None else x


class BertPooler(nn.Module):
    """tanh(dense(first token)): the sentence representation the NSP and classification heads read. Packed rows
    (sequence_starts [B, K]): the same at every packed sequence's own [CLS]."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, sequence_output: torch.Tensor, sequence_starts: torch.Tensor | None = None) -> torch.Tensor:
        if sequence_starts is not None:
            return torch.tanh(self.dense(gather_indexes(sequence_output, sequence_starts)))  # [B, K, H]
        return torch.tanh(self.dense(sequence_output[:, 0]))  # [B, H] from the [CLS] position


def _init_weights(module: nn.Module, std: float) -> None:
    """normal(0, std) for every Linear and Embedding weight, zero biases, LayerNorm 1/0 (Google's BERT)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=std)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    if isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


class BertModel(nn.Module):
    """The BERT encoder.

    forward(input_ids [B,S], token_type_ids [B,S] = zeros, attention_mask [B,S] = ones (1 = real token))
    -> BertModelOutput(sequence_output [B,S,H], pooled_output [B,H] or None without a pooler); with
    output_hidden_states=True a BertModelOutputWithHiddenStates, whose third field holds the L + 1 tensors
    [B,S,H] of transformers' `hidden_states`: the embeddings' output, then each layer's.

    Unpadding (`unpad`, an attribute a run sets: set_execution): on a batch with padding the encoder can run on
    the real tokens only, [T, H], with attention over each sequence's own tokens (bert_padding.py,
    bert_attention.py); the outputs are padded back to [B, S, H] with zeros at the padding positions, where the
    padded path has values no correct consumer reads (transformers' too). Callers that do read them (question
    answering's softmax over every position) pass padding_positions_read=True, the default, and "auto" then keeps
    the padded path for them.

    Sequence packing: with sequence_starts [B, K] (where each of up to K sequences of a row starts; see
    bert_padding.packed_layout) every sequence attends only to itself, its positions restart at 0 and
    pooled_output is [B, K, H], one per sequence's own [CLS]. The unpadded path gives each sequence its own
    cu_seqlens entry (taken even for a row without padding); the padded path gets the block-diagonal mask. A row
    of packed sequences gives each sequence the outputs it would have alone.
    """

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.apply(lambda m: _init_weights(m, config.initializer_range))

    unpad: str = "auto"
    """Run the encoder on the real tokens only ([T, H]) when a batch has padding: auto (where no output at a padding
    position is read: pre-training with labels; never inside a torch.compile'd graph or a trace, unless the host
    hands a static-shape layout), always, never. How the model runs, not what it is: set by set_execution."""

    def unpadded(
        self,
        attention_mask: torch.Tensor | None,
        padding_positions_read: bool,
        packed: Packed | None = None,
        host: Unpadded | None = None,
    ) -> Unpadded | None:
        """Where this batch's real tokens are, when the encoder is to run on them alone; None for the padded path.
        host: the same description made on the host before the batch moved (bert_padding.host_unpad_info), used
        instead of computing it here (which syncs the device); it is None when the batch has no padding. A host
        description in a static-shape layout (cuda_graphs.fixed_rows) has no data-dependent shape, so it is taken
        inside a graph too."""
        mode = self.unpad
        if mode == "never" or (mode == "auto" and padding_positions_read):
            return None
        graph = torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.jit.is_scripting()
        if mode == "auto" and graph and not (host is not None and host.fixed):
            return None  # data-dependent shapes: a graph break under compile, a frozen shape in a trace
        if host is not None:
            key_mask = packed.block_mask if packed is not None else attention_mask[:, None, None, :].bool()
            return host._replace(key_mask=key_mask)  # [B, 1, S, S] / [B, 1, 1, S], as unpad_info makes it
        if packed is not None:  # the sequences' boundaries are needed even in a row without padding
            return unpad_info(attention_mask, packed)
        if has_padding(attention_mask):
            return unpad_info(attention_mask)
        return None  # no padding: the plain path

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        padding_positions_read: bool = True,
        sequence_starts: torch.Tensor | None = None,
        unpadded: Unpadded | None = None,
    ) -> BertModelOutput | BertModelOutputWithHiddenStates:
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        packed = None
        if sequence_starts is not None:  # packed rows: which sequence each token is in, its position within it
            if attention_mask is None:
                attention_mask = torch.ones_like(input_ids)
            packed = packed_layout(attention_mask, sequence_starts)
        info = self.unpadded(attention_mask, padding_positions_read, packed, host=unpadded)
        if info is not None:  # the real tokens only: [B, S] -> [T]
            if packed is not None:
                position_ids = packed.position_ids.reshape(-1)  # [B*S], restarting in every sequence
            else:
                position_ids = torch.arange(info.seqlen, device=input_ids.device).repeat(info.batch)  # [B*S]
            x = self.embeddings(
                unpad(input_ids, info), unpad(token_type_ids, info), unpad(position_ids, info)
            )  # [T, H]
            attn_mask = info
        elif packed is not None:  # padded path over packed rows: block-diagonal attention, restarting positions
            attn_mask = packed.block_mask  # [B, 1, S, S]
            x = self.embeddings(input_ids, token_type_ids, packed.position_ids)  # [B, S, H]
        else:
            attn_mask = None  # None lets SDPA take its fastest path when nothing is padded
            if attention_mask is not None:
                attn_mask = attention_mask[:, None, None, :].bool()  # [B, 1, 1, S]: True = attend to this key
            x = self.embeddings(input_ids, token_type_ids)  # [B, S, H]
        if output_hidden_states:
            sequence_output, hidden_states = self.encoder(x, attn_mask, output_hidden_states=True)
        else:
            sequence_output = self.encoder(x, attn_mask)  # [B, S, H] (unpadded: [T, H])
        if info is not None:  # back to [B, S, H], zeros at the padding positions
            sequence_output = pad(sequence_output, info)  # [T, H] -> [B, S, H]
            if output_hidden_states:
                hidden_states = tuple(pad(h, info) for h in hidden_states)  # each [T, H] -> [B, S, H]
        pooled_output = self.pooler(sequence_output, sequence_starts) if self.pooler is not None else None
        if output_hidden_states:
            return BertModelOutputWithHiddenStates(sequence_output, pooled_output, hidden_states)
        return BertModelOutput(sequence_output, pooled_output)


# ----------------------------------------------------------------------------------------------------------------
# Heads


class BertPredictionHeadTransform(nn.Module):
    """dense + activation + LayerNorm before the vocabulary projection (NVIDIA fuses dense and GELU: dense_act)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = _activation(config.hidden_act)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    """transform (dense + act + LayerNorm), then the decoder whose weight is the word-embedding matrix, plus a
    separate output bias (`cls.predictions.bias`)."""

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.padded_vocab_size, bias=False)
        self.decoder.weight = word_embeddings.weight  # tied
        self.bias = nn.Parameter(torch.zeros(config.padded_vocab_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.transform(x), self.decoder.weight, self.bias)  # [..., V]


COMPILE_REGIONS = (BertEmbeddings, BertLayer, BertLMPredictionHead)
"""What torch.compile takes one by one under regional compilation (parallelize.apply_parallelism_and_precision,
compile_scope "layers"): the repeated layer, whose one graph serves every layer, and the two ends around it."""


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.predictions = BertLMPredictionHead(config, word_embeddings)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


class BertForPreTraining(nn.Module):
    """BERT with the masked-LM and next-sentence heads.

    forward(input_ids [B,S], token_type_ids, attention_mask, masked_lm_labels [B,S], next_sentence_labels [B])
    Labels below 0 (-1 in NVIDIA's data, -100 in Hugging Face's) mark positions that are not predicted.

    Without masked_lm_labels: PreTrainingOutput(prediction_scores [B,S,V], seq_relationship_score [B,2]).
    With masked_lm_labels: PreTrainingOutputWithLoss(loss, mlm_loss, nsp_loss, prediction_scores [M,V],
    seq_relationship_score [B,2]), where prediction_scores are computed only at the M labelled positions
    (gathered before the vocabulary projection: for small models that projection is most of the compute) and
    nsp_loss is None without next_sentence_labels. loss = mean MLM cross-entropy over the M positions + NSP
    cross-entropy. Two types, because prediction_scores has another shape in each.

    The fixed-slot head (Google's gather_indexes, compile-friendly): instead of masked_lm_labels pass the shards'
    masked_lm_positions [B,P] and masked_lm_ids [B,P] (P = max_predictions_per_seq; position 0 marks an unused
    slot, [CLS] is never masked). The P slots of every sequence are gathered and scored, prediction_scores is
    [B,P,V] (unused slots included), and the loss ignores unused slots: the same mean over the labelled positions
    as the sparse head, with static shapes and no host sync (no nonzero), so torch.compile(fullgraph=True) works.

    Packed rows (sequence packing; create_pretraining_data.py --pack_sequences): pass next_sentence_positions [B,K]
    (each packed sequence's [CLS]; slot 0 at 0, a later slot at 0 is unused) with next_sentence_labels [B,K] (-1 in
    unused slots) and the row's masked_lm_positions/masked_lm_ids. Each sequence attends only to itself with its
    own positions (BertModel), seq_relationship_score is [B,K,2], and the losses are the MLM mean over every masked
    token and the NSP mean over the real sequences: the losses of the same sequences unpacked.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config, self.bert.embeddings.word_embeddings)
        self.cls.apply(lambda m: _init_weights(m, config.initializer_range))
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight  # re-tie after init

    def forward(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        masked_lm_labels=None,
        next_sentence_labels=None,
        masked_lm_positions=None,
        masked_lm_ids=None,
        next_sentence_positions=None,
        unpadded=None,
    ) -> PreTrainingOutput | PreTrainingOutputWithLoss:
        fixed_slots = masked_lm_positions is not None
        if fixed_slots and (masked_lm_ids is None or masked_lm_labels is not None):
            raise ValueError(
                "BertForPreTraining: pass masked_lm_positions together with masked_lm_ids, and not "
                "with masked_lm_labels"
            )
        if (
            next_sentence_positions is not None
            and next_sentence_labels is not None
            and next_sentence_labels.shape != next_sentence_positions.shape
        ):
            raise ValueError(
                f"BertForPreTraining: packed rows need next_sentence_labels of the shape of "
                f"next_sentence_positions {tuple(next_sentence_positions.shape)}, got "
                f"{tuple(next_sentence_labels.shape)}"
            )
        # With labels only the labelled positions and [CLS] are read: the encoder may skip the padding (unpad).
        sequence_output, pooled_output = self.bert(
            input_ids,
            token_type_ids,
            attention_mask,
            padding_positions_read=masked_lm_labels is None and not fixed_slots,
            sequence_starts=next_sentence_positions,
            unpadded=unpadded,
        )  # [B, S, H], [B, H] (packed: [B, K, H])
        seq_relationship_score = self.cls.seq_relationship(pooled_output)  # [B, 2] (packed: [B, K, 2])
        if masked_lm_labels is None and not fixed_slots:
            return PreTrainingOutput(self.cls.predictions(sequence_output), seq_relationship_score)  # [B, S, V]

        if fixed_slots:  # P slots per sequence, static shapes
            hidden = gather_indexes(sequence_output, masked_lm_positions)  # [B, P, H]
            prediction_scores = self.cls.predictions(hidden)  # [B, P, V]
            # Unused slots (position 0) get the ignored label: cross_entropy's mean is then over the used slots.
            labels = torch.where(masked_lm_positions > 0, masked_lm_ids.long(), -100)  # [B, P]
            mlm_loss = F.cross_entropy(
                prediction_scores.flatten(0, 1).float(), labels.reshape(-1), ignore_index=-100
            )  # [B*P, V] against [B*P]
        else:  # the labelled positions only: M depends on the data (nonzero, a host sync)
            labels = masked_lm_labels.reshape(-1)  # [B*S]
            predicted = (labels >= 0).nonzero().squeeze(1)  # [M] flat indices of the labelled positions
            hidden = sequence_output.reshape(-1, sequence_output.shape[-1]).index_select(0, predicted)  # [M, H]
            prediction_scores = self.cls.predictions(hidden)  # [M, V]
            mlm_loss = F.cross_entropy(prediction_scores.float(), labels.index_select(0, predicted))
        nsp_loss = None
        loss = mlm_loss
        if next_sentence_labels is not None:
            # The mean over the real sequences: unused slots of packed rows carry the label -1 and are ignored.
            nsp_loss = F.cross_entropy(
                seq_relationship_score.reshape(-1, 2).float(),  # [B, 2] (packed: [B*K, 2])
                next_sentence_labels.reshape(-1).long(),
                ignore_index=-1,
            )
            loss = mlm_loss + nsp_loss
        return PreTrainingOutputWithLoss(loss, mlm_loss, nsp_loss, prediction_scores, seq_relationship_score)


class BertForQuestionAnswering(nn.Module):
    """Span extraction (SQuAD): a linear layer gives each token a start and an end logit.

    forward(input_ids, token_type_ids, attention_mask) -> QuestionAnsweringOutput(start_logits [B,S],
    end_logits [B,S]); with start_positions and end_positions [B]: QuestionAnsweringOutputWithLoss(loss,
    start_logits, end_logits), the loss being the mean of the start and end cross-entropies (positions outside
    the sequence are ignored, as in Hugging Face).
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        _init_weights(self.qa_outputs, config.initializer_range)

    def forward(
        self, input_ids, token_type_ids=None, attention_mask=None, start_positions=None, end_positions=None
    ) -> QuestionAnsweringOutput | QuestionAnsweringOutputWithLoss:
        sequence_output = self.bert(input_ids, token_type_ids, attention_mask).sequence_output
        logits = self.qa_outputs(sequence_output)  # [B, S, 2]
        start_logits, end_logits = logits.float().unbind(-1)  # each [B, S]
        if start_positions is None or end_positions is None:
            return QuestionAnsweringOutput(start_logits, end_logits)
        seq_len = start_logits.shape[1]
        start_positions = start_positions.clamp(0, seq_len)  # seq_len is out of range: ignored below
        end_positions = end_positions.clamp(0, seq_len)
        loss = (
            F.cross_entropy(start_logits, start_positions, ignore_index=seq_len)
            + F.cross_entropy(end_logits, end_positions, ignore_index=seq_len)
        ) / 2
        return QuestionAnsweringOutputWithLoss(loss, start_logits, end_logits)


class BertForSequenceClassification(nn.Module):
    """Dropout and a linear layer on the pooled output. num_labels == 1 means regression (STS-B).

    forward(input_ids, token_type_ids, attention_mask) -> SequenceClassificationOutput(logits [B, num_labels]);
    with labels [B]: SequenceClassificationOutputWithLoss(loss, logits) with cross-entropy, or mean squared error
    for regression.
    """

    def __init__(self, config: BertConfig, num_labels: int = 2):
        super().__init__()
        if num_labels < 1:
            raise ValueError(f"num_labels must be >= 1, got {num_labels}")
        self.config = config
        self.num_labels = num_labels
        self.bert = BertModel(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        _init_weights(self.classifier, config.initializer_range)

    def forward(
        self, input_ids, token_type_ids=None, attention_mask=None, labels=None
    ) -> SequenceClassificationOutput | SequenceClassificationOutputWithLoss:
        pooled_output = self.bert(input_ids, token_type_ids, attention_mask).pooled_output
        logits = self.classifier(self.dropout(pooled_output)).float()  # [B, num_labels]
        if labels is None:
            return SequenceClassificationOutput(logits)
        if self.num_labels == 1:
            loss = F.mse_loss(logits.squeeze(-1), labels.float())  # [B] vs [B]
        else:
            loss = F.cross_entropy(logits, labels.long())
        return SequenceClassificationOutputWithLoss(loss, logits)


class BertForMultipleChoice(nn.Module):
    """One score per choice (SWAG): each choice is its own [CLS] context [SEP] ending [SEP] sequence, and dropout
    and a linear layer (H -> 1) on its pooled output give its score; a softmax over the choices is the model's
    distribution. Parameter names are transformers' BertForMultipleChoice (`classifier.weight` [1, H]).

    forward(input_ids [B,C,S], token_type_ids [B,C,S], attention_mask [B,C,S]) -> MultipleChoiceOutput(logits
    [B, C]); with labels [B] (the right choice's index) a MultipleChoiceOutputWithLoss, the loss being the
    cross-entropy over the choices.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, 1)
        _init_weights(self.classifier, config.initializer_range)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None):
        B, C, S = input_ids.shape
        # every choice is a sequence of its own: [B, C, S] -> [B*C, S]
        flat = [None if t is None else t.reshape(B * C, S) for t in (input_ids, token_type_ids, attention_mask)]
        pooled_output = self.bert(*flat).pooled_output  # [B*C, H]
        logits = self.classifier(self.dropout(pooled_output)).float().view(B, C)  # [B*C, 1] -> [B, C]
        if labels is None:
            return MultipleChoiceOutput(logits)
        return MultipleChoiceOutputWithLoss(F.cross_entropy(logits, labels.long()), logits)


# ----------------------------------------------------------------------------------------------------------------
# Outputs: every forward returns a named tuple, so callers write `out.loss`, `out.start_logits`, and positional
# unpacking (`start, end = model(...)`) keeps working. A head returns one type without labels and another with
# them (the loss fields first, in the order the original returned them), never a tuple whose length depends on
# the arguments.


class BertModelOutput(NamedTuple):
    sequence_output: torch.Tensor  # [B, S, H] the last layer at every position
    pooled_output: torch.Tensor | None  # [B, H] tanh(dense(first token)); None for BertModel(add_pooling_layer=False)
    # ([B, K, H] with sequence_starts: one per packed sequence's [CLS])


class BertModelOutputWithHiddenStates(NamedTuple):
    sequence_output: torch.Tensor  # [B, S, H]
    pooled_output: torch.Tensor | None  # [B, H]
    hidden_states: tuple[torch.Tensor, ...]  # L + 1 tensors [B, S, H]: the embeddings' output, then each layer's


class PreTrainingOutput(NamedTuple):
    """BertForPreTraining without labels: scores at every position."""

    prediction_scores: torch.Tensor  # [B, S, V] masked-LM logits over the (padded) vocabulary
    seq_relationship_score: torch.Tensor  # [B, 2] next-sentence logits (0 = B follows A)


class PreTrainingOutputWithLoss(NamedTuple):
    """BertForPreTraining with masked_lm_labels: the losses, and scores only where a label is."""

    loss: torch.Tensor  # [] mlm_loss + nsp_loss (mlm_loss alone without next_sentence_labels)
    mlm_loss: torch.Tensor  # [] mean cross-entropy over the M labelled positions
    nsp_loss: torch.Tensor | None  # [] next-sentence cross-entropy; None without next_sentence_labels
    prediction_scores: torch.Tensor  # [M, V] at the labelled positions, in row-major (batch, position) order;
    # [B, P, V] at the P slots with masked_lm_positions (unused slots included)
    seq_relationship_score: torch.Tensor  # [B, 2] ([B, K, 2] for packed rows: one per slot)


class QuestionAnsweringOutput(NamedTuple):
    start_logits: torch.Tensor  # [B, S] float32
    end_logits: torch.Tensor  # [B, S] float32


class QuestionAnsweringOutputWithLoss(NamedTuple):
    loss: torch.Tensor  # [] mean of the start and end cross-entropies
    start_logits: torch.Tensor  # [B, S]
    end_logits: torch.Tensor  # [B, S]


class SequenceClassificationOutput(NamedTuple):
    logits: torch.Tensor  # [B, num_labels] float32 (num_labels 1: a regression score)


class SequenceClassificationOutputWithLoss(NamedTuple):
    loss: torch.Tensor  # [] cross-entropy, or mean squared error for regression
    logits: torch.Tensor  # [B, num_labels]


class MultipleChoiceOutput(NamedTuple):
    logits: torch.Tensor  # [B, C] float32, one score per choice


class MultipleChoiceOutputWithLoss(NamedTuple):
    loss: torch.Tensor  # [] cross-entropy over the choices
    logits: torch.Tensor  # [B, C]


# ----------------------------------------------------------------------------------------------------------------
# Size and cost, from the architecture: parameter count (model summaries) and FLOPs (run_pretraining.py's MFU).


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def flops_per_sequence(config: BertConfig, seq_len: int, masked_positions: int, training: bool = True) -> float:
    """Model FLOPs of one sequence (matmuls only; 2 per multiply-add, x3 for forward + backward when training):
    the encoder over seq_len tokens plus the MLM head over masked_positions, as used for MFU."""
    H, F, L = config.hidden_size, config.intermediate_size, config.num_hidden_layers  # F: the feed-forward width
    per_token_layer = 2 * (4 * H * H + 2 * H * F) + 2 * 2 * seq_len * H  # projections + QK^T and PV
    encoder = L * seq_len * per_token_layer
    head = masked_positions * 2 * (H * H + H * config.padded_vocab_size) + 2 * 2 * H * H  # MLM + pooler/NSP
    return (encoder + head) * (3 if training else 1)


# ----------------------------------------------------------------------------------------------------------------
# How a model runs (not what it is: no BertConfig field, so a checkpoint never saves it)

UNPAD_MODES = ("auto", "always", "never")

RETIRED_CONFIG_KEYS = ("unpad", "varlen_kernel", "unpad_token_multiple", "unpad_fixed_sizes", "dropout_mask_bits")
"""Execution settings that configs and checkpoints of earlier versions carried beside the architecture: from_dict
ignores them (such a checkpoint loads as any other); a run takes them as flags (--unpad, --varlen_kernel)."""


def set_execution(model: nn.Module, unpad: str | None = None, varlen_kernel: str | None = None) -> nn.Module:
    """Set how every BertModel in `model` unpads (`unpad`: one of UNPAD_MODES) and which kernel its unpadded
    attention uses (`varlen_kernel`: "auto" or a name from bert_attention.KERNELS); None leaves a setting as it is.
    Returns the model. A bad name is a one-line ValueError."""
    if unpad is not None and unpad not in UNPAD_MODES:
        raise ValueError(f"unpad {unpad!r} is not one of {UNPAD_MODES}")
    if varlen_kernel is not None and varlen_kernel not in ("auto",) + KERNELS:
        raise ValueError(f"varlen_kernel {varlen_kernel!r} is not one of {('auto',) + KERNELS}")
    for module in model.modules():
        if unpad is not None and isinstance(module, BertModel):
            module.unpad = unpad
        if varlen_kernel is not None and isinstance(module, BertSelfAttention):
            module.varlen_kernel = varlen_kernel
    return model
