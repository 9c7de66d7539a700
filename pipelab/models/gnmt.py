"""GNMT (Wu et al. 2016) as PipeDream profiled it: the MLPerf reference's layout, parameter for parameter.

GNMT-8 is 4 encoder + 4 decoder LSTM layers, GNMT-16 8 + 8 (PipeDream, SOSP'19, §5.1). Encoder: a
bidirectional LSTM (``2 * hidden`` out), ``2*hidden -> hidden``, then residual ``hidden -> hidden``
layers. Decoder: an attention LSTM whose output queries a normalized Bahdanau attention; later layers
take ``[input ; context]``, residual from layer 3. For torch.fx, sequences are not packed (attention
masks padding) and each ``nn.LSTM`` is one layer.
"""

from __future__ import annotations

import math

import torch
from torch import nn

PAD = 0


def lstm_param_count(input_size: int, hidden: int, directions: int = 1) -> int:
    """Parameters of one ``nn.LSTM`` layer: per direction ``4H x (in + H)`` weights + two ``4H`` biases."""
    return directions * (4 * hidden * (input_size + hidden) + 2 * 4 * hidden)


def gnmt_param_count(num_layers: int = 8, vocab: int = 32000, hidden: int = 1024, *,
                     share_embedding: bool = False, normalize_attention: bool = True) -> int:
    """Closed-form parameter count of :func:`gnmt` (the oracle the tests compare against)."""
    enc, dec = num_layers // 2, num_layers // 2
    h = hidden
    embeddings = (1 if share_embedding else 2) * vocab * h
    encoder = lstm_param_count(h, h, 2) + lstm_param_count(2 * h, h) + (enc - 2) * lstm_param_count(h, h)
    attention = 2 * h * h + h + ((h + 1) if normalize_attention else 0)  # W_q, W_k, v [, b, g]
    decoder = lstm_param_count(h, h) + attention + (dec - 1) * lstm_param_count(2 * h, h)
    classifier = h * vocab + vocab
    return embeddings + encoder + decoder + classifier


class BahdanauAttention(nn.Module):
    """Additive attention (Bahdanau et al. 2015) with the weight normalization of the MLPerf reference:
    ``score(q, k) = g * v/|v| . tanh(W_q q + W_k k + b)``; the context averages the raw keys."""

    def __init__(self, hidden: int, *, normalize: bool = True, init: float = 0.1) -> None:
        super().__init__()
        self.normalize = normalize
        self.linear_q = nn.Linear(hidden, hidden, bias=False)
        self.linear_k = nn.Linear(hidden, hidden, bias=False)
        self.linear_att = nn.Parameter(torch.empty(hidden).uniform_(-init, init))
        if normalize:
            self.normalize_scalar = nn.Parameter(torch.tensor([1.0 / math.sqrt(hidden)]))
            self.normalize_bias = nn.Parameter(torch.zeros(hidden))

    def forward(self, query: torch.Tensor, keys: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        """``query [B,T,H]``, ``keys [B,S,H]``, ``pad_mask [B,S]`` (True: padding) -> ``[B,T,H]``."""
        q = self.linear_q(query).unsqueeze(2)          # [B,T,1,H]
        k = self.linear_k(keys).unsqueeze(1)           # [B,1,S,H]
        s = q + k
        if self.normalize:
            s = s + self.normalize_bias
            v = self.linear_att / self.linear_att.norm() * self.normalize_scalar
        else:
            v = self.linear_att
        scores = torch.tanh(s).matmul(v)               # [B,T,S]
        # -65504 (the fp16 minimum) rather than -inf: a row of all padding stays finite.
        scores = scores.masked_fill(pad_mask.unsqueeze(1), -65504.0)
        return torch.bmm(torch.softmax(scores, dim=-1), keys)


class GNMT(nn.Module):
    """GNMT encoder-decoder: ``forward(src [B,S] int64, tgt [B,T] int64) -> logits [B,T,vocab]``."""

    def __init__(self, num_layers: int = 8, vocab: int = 32000, hidden: int = 1024, *, dropout: float = 0.2,
                 share_embedding: bool = False, normalize_attention: bool = True, init: float = 0.1) -> None:
        super().__init__()
        if num_layers < 4 or num_layers % 2:
            raise ValueError(f"num_layers={num_layers} must be even and >= 4 (half encoder, half decoder; "
                             "PipeDream's GNMT-8 is 8, GNMT-16 is 16)")
        if vocab < 2 or hidden < 1:
            raise ValueError(f"vocab={vocab} must be >= 2 and hidden={hidden} >= 1")
        enc, dec = num_layers // 2, num_layers // 2
        self.num_layers, self.vocab, self.hidden = num_layers, vocab, hidden
        self.embed_src = nn.Embedding(vocab, hidden, padding_idx=PAD)
        self.embed_tgt = self.embed_src if share_embedding else nn.Embedding(vocab, hidden, padding_idx=PAD)
        self.dropout = nn.Dropout(dropout)
        self.encoder = nn.ModuleList(
            [nn.LSTM(hidden, hidden, batch_first=True, bidirectional=True),
             nn.LSTM(2 * hidden, hidden, batch_first=True)]
            + [nn.LSTM(hidden, hidden, batch_first=True) for _ in range(enc - 2)])
        self.att_rnn = nn.LSTM(hidden, hidden, batch_first=True)
        self.attention = BahdanauAttention(hidden, normalize=normalize_attention, init=init)
        self.decoder = nn.ModuleList([nn.LSTM(2 * hidden, hidden, batch_first=True) for _ in range(dec - 1)])
        self.classifier = nn.Linear(hidden, vocab)
        # The reference initializes every weight uniformly in [-0.1, 0.1].
        for name, p in self.named_parameters():
            if "normalize" not in name:
                nn.init.uniform_(p, -init, init)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits for target tokens ``tgt`` given source tokens ``src``."""
        pad_mask = src.eq(PAD)
        x = self.embed_src(src)
        x = self.encoder[0](x)[0]                      # bidirectional: [B,S,2H]
        x = self.dropout(x)
        x = self.encoder[1](x)[0]
        for rnn in self.encoder[2:]:
            residual = x
            x = self.dropout(x)
            x = rnn(x)[0]
            x = x + residual
        enc_out = x
        y = self.embed_tgt(tgt)
        query = self.att_rnn(y)[0]                     # decoder layer 1
        context = self.attention(query, enc_out, pad_mask)
        x = self.dropout(query)
        x = self.decoder[0](torch.cat((x, context), dim=2))[0]
        for rnn in self.decoder[1:]:
            residual = x
            x = self.dropout(x)
            x = rnn(torch.cat((x, context), dim=2))[0]
            x = x + residual
        return self.classifier(x)


def gnmt(num_layers: int = 8, vocab: int = 32000, hidden: int = 1024, **kwargs: object) -> GNMT:
    """GNMT-8 (``num_layers=8``: 4 encoder + 4 decoder LSTMs) or GNMT-16; tiny sizes for tests
    (e.g. ``vocab=100, hidden=32``). Keywords: ``dropout``, ``share_embedding``, ``normalize_attention``."""
    return GNMT(num_layers, vocab, hidden, **kwargs)  # type: ignore[arg-type]
