"""A transformer by its shape: layers, hidden size, heads, feed-forward size, sequence, vocabulary.

The :class:`Transformer` record is all the LLM cost model knows about a model. Its counts come from
the matrix multiplies of one block, written out in :meth:`Transformer.matmuls` (per sequence of
``seq`` tokens, forward):

==============  =====================================  ==========================
matmul          shape (rows x inner x cols)            FLOPs (2 per multiply-add)
==============  =====================================  ==========================
qkv             s x h x (h + 2 kv d)                   2 s h (h + 2 kv d)
scores          heads x (s x d x s)                    2 s^2 h
context         heads x (s x s x d)                    2 s^2 h
proj            s x h x h                              2 s h^2
mlp_up          s x h x f (twice with a gated MLP)     2 s h f (x2 gated)
mlp_down        s x f x h                              2 s f h
head            s x h x V                              2 s h V
==============  =====================================  ==========================

(``d = hidden / heads``, ``kv`` key/value heads.) With ``f = 4h``, full attention and no gate one
block costs ``24 s h^2 (1 + s / 6h)`` per sequence forward, and forward + backward of the model
``72 B s l h^2 (1 + s/6h + V/12lh)``: Narayanan et al., SC'21, eq. (3) without recomputation. A
backward computes input gradients (``B``: each matmul once, the two attention-core matmuls twice)
and weight gradients (``W``: each weight matmul once); ``B + W = 2 F``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

#: Hugging Face ``model_type`` values :meth:`Transformer.from_hf_config` reads (parameter counts checked
#: against torch's in tests/test_llm.py)
HF_FAMILIES = ("gpt2", "llama", "mistral")
#: bytes per element of each precision name
PRECISION_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
KINDS = ("decoder", "encoder")


@dataclass(frozen=True)
class Matmul:
    """One matrix multiply of a block, for one sequence: ``rows x inner`` times ``inner x cols``, ``count``
    times (heads), with or without a weight (``weight=False``: the attention core)."""

    name: str
    rows: int
    inner: int
    cols: int
    count: int = 1
    weight: bool = True

    @property
    def flops(self) -> int:
        """Forward FLOPs (2 per multiply-add)."""
        return 2 * self.rows * self.inner * self.cols * self.count

    def operand_bytes(self, bytes_per_element: int) -> int:
        """Bytes it reads and writes: both operands and the product, ``count`` times."""
        return bytes_per_element * self.count * (self.rows * self.inner + self.inner * self.cols
                                                 + self.rows * self.cols)


@dataclass(frozen=True)
class Transformer:
    """A decoder (or encoder) transformer by its shape; every field a keyword.

    Args:
        kv_heads: key/value heads (grouped-query attention); ``heads`` for multi-head attention.
        ffn: the feed-forward size (``4 * hidden`` in GPT-2/3).
        gated_mlp: SwiGLU-style MLP (three weight matrices, Llama) instead of two (GPT).
        tied: the head reuses the embedding's matrix (one copy of ``vocab x hidden``).
        precision: the weights' and activations' precision name (:data:`PRECISION_BYTES`).
        bias: linear layers and norms carry biases (GPT-2/3 do; Llama does not).
        positions: learned position embeddings (``seq x hidden``; GPT-2) or none (rotary).
    """

    name: str
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    kv_heads: int = 0
    ffn: int = 0
    tied: bool = True
    precision: str = "bf16"
    kind: str = "decoder"
    gated_mlp: bool = False
    bias: bool = True
    positions: bool = True

    def __post_init__(self) -> None:
        for label in ("layers", "hidden", "heads", "seq", "vocab"):
            v = getattr(self, label)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Transformer {self.name!r}: {label}={v!r} must be an integer >= 1")
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.ffn == 0:
            object.__setattr__(self, "ffn", 4 * self.hidden)
        if self.hidden % self.heads:
            raise ValueError(f"Transformer {self.name!r}: hidden={self.hidden} is not a multiple of "
                             f"heads={self.heads}; each head needs hidden/heads dimensions")
        if self.kv_heads < 1 or self.heads % self.kv_heads:
            raise ValueError(f"Transformer {self.name!r}: kv_heads={self.kv_heads} must divide heads="
                             f"{self.heads} (grouped-query attention shares one key/value head per group)")
        if self.precision not in PRECISION_BYTES:
            raise ValueError(f"Transformer {self.name!r}: precision={self.precision!r} is not one of "
                             f"{', '.join(PRECISION_BYTES)}")
        if self.kind not in KINDS:
            raise ValueError(f"Transformer {self.name!r}: kind={self.kind!r} is not one of {KINDS}")

    # --- shape -------------------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        """Dimensions per attention head."""
        return self.hidden // self.heads

    @property
    def bytes_per_element(self) -> int:
        """Bytes of one weight or activation element in :attr:`precision`."""
        return PRECISION_BYTES[self.precision]

    def matmuls(self, tokens: int | None = None) -> tuple[Matmul, ...]:
        """The matrix multiplies of one block for ``tokens`` rows (default one sequence, ``seq``)."""
        s = self.seq if tokens is None else tokens
        h, f, d = self.hidden, self.ffn, self.head_dim
        seqs = max(1, s // self.seq)
        return (Matmul("qkv", s, h, h + 2 * self.kv_heads * d),
                Matmul("scores", self.seq, d, self.seq, count=self.heads * seqs, weight=False),
                Matmul("context", self.seq, self.seq, d, count=self.heads * seqs, weight=False),
                Matmul("proj", s, h, h),
                Matmul("mlp_up", s, h, f, count=2 if self.gated_mlp else 1),
                Matmul("mlp_down", s, f, h))

    # --- parameters --------------------------------------------------------------------------------
    def block_params(self) -> int:
        """Parameters of one block: attention, MLP and two norms (with biases where :attr:`bias`)."""
        h, f, kvd = self.hidden, self.ffn, self.kv_heads * self.head_dim
        attn = h * (h + 2 * kvd) + h * h
        mlp = h * f * (3 if self.gated_mlp else 2)
        norms = 2 * h * (2 if self.bias else 1)
        biases = (h + 2 * kvd) + h + (f * (2 if self.gated_mlp else 1) + h) if self.bias else 0
        return attn + mlp + norms + biases

    def embedding_params(self) -> int:
        """Parameters of the input embedding (tokens, and learned positions where :attr:`positions`)."""
        return self.vocab * self.hidden + (self.seq * self.hidden if self.positions else 0)

    def final_norm_params(self) -> int:
        """Parameters of the norm after the last block."""
        return self.hidden * (2 if self.bias else 1)

    def head_params(self) -> int:
        """Parameters of the output head: none of its own when :attr:`tied` (it reuses the embedding)."""
        return 0 if self.tied else self.vocab * self.hidden

    def params(self) -> int:
        """All parameters, a tied matrix counted once."""
        return (self.embedding_params() + self.layers * self.block_params() + self.final_norm_params()
                + self.head_params())

    # --- FLOPs -------------------------------------------------------------------------------------
    def block_flops(self, sequences: int = 1) -> dict[str, int]:
        """Forward, input-gradient and weight-gradient FLOPs of one block for ``sequences`` sequences:
        ``{"forward", "backward_input", "backward_weight"}``."""
        mms = self.matmuls()
        fwd = sum(m.flops for m in mms)
        core = sum(m.flops for m in mms if not m.weight)
        return {"forward": sequences * fwd, "backward_input": sequences * (fwd + core),
                "backward_weight": sequences * (fwd - core)}

    def head_flops(self, sequences: int = 1) -> int:
        """Forward FLOPs of the output head (logits) for ``sequences`` sequences."""
        return sequences * 2 * self.seq * self.hidden * self.vocab

    def flops_per_iteration(self, batch: int, *, recompute: bool = False) -> int:
        """Model FLOPs of forward and backward over ``batch`` sequences (with ``recompute``: plus one more
        forward of every block, the hardware FLOPs of full recomputation)."""
        blk = self.block_flops(batch)
        per_block = sum(blk.values()) + (blk["forward"] if recompute else 0)
        return self.layers * per_block + 3 * self.head_flops(batch)

    def flops_per_token(self) -> float:
        """Model FLOPs of forward and backward per token (``~ 6 N`` for long models)."""
        return self.flops_per_iteration(1) / self.seq

    # --- records -----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Transformer:
        """Inverse of :meth:`to_dict`; unknown keys are refused by name."""
        known = {f.name for f in fields(cls)}
        bad = sorted(set(d) - known)
        if bad:
            raise ValueError(f"Transformer.from_dict: unknown keys {bad}; known: {sorted(known)}")
        return cls(**dict(d))

    @classmethod
    def from_hf_config(cls, cfg: Any, *, name: str | None = None, precision: str = "bf16",
                       seq: int | None = None) -> Transformer:
        """The shape of a Hugging Face ``PretrainedConfig`` of a family in :data:`HF_FAMILIES` (others are
        refused: their extra parts, e.g. BERT's pooler or Qwen2's qkv biases, would be miscounted).

        Args:
            seq: sequence length (default the config's maximum positions).
        """
        get = cfg.get if isinstance(cfg, Mapping) else (lambda k, default=None: getattr(cfg, k, default))
        if str(get("model_type", "") or "") not in HF_FAMILIES:
            raise ValueError(f"Transformer.from_hf_config: model_type {get('model_type')!r} is not one of "
                             f"{', '.join(HF_FAMILIES)}; build Transformer(...) by hand from its shape")

        def first(*keys: str) -> Any:
            for k in keys:
                v = get(k)
                if v is not None:
                    return v
            raise ValueError(f"Hugging Face config has none of {keys}; build the Transformer by hand")

        mtype = str(get("model_type"))
        hidden = int(first("hidden_size", "n_embd", "d_model"))
        heads = int(first("num_attention_heads", "n_head"))
        gated = mtype in ("llama", "mistral")
        max_pos = int(first("max_position_embeddings", "n_positions", "n_ctx"))
        ffn = get("intermediate_size") or get("n_inner") or 4 * hidden
        return cls(name=name or mtype or "hf", layers=int(first("num_hidden_layers", "n_layer")),
                   hidden=hidden, heads=heads, kv_heads=int(get("num_key_value_heads") or heads),
                   ffn=int(ffn), seq=seq or max_pos, vocab=int(first("vocab_size")),
                   tied=bool(get("tie_word_embeddings", True)), precision=precision,
                   gated_mlp=gated, bias=not gated, positions=not gated)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> Transformer:
        """A named shape (:data:`PRESETS`), with any field overridden by keyword."""
        if name not in PRESETS:
            raise ValueError(f"unknown Transformer preset {name!r}; choose one of {', '.join(PRESETS)}")
        return cls.from_dict({**PRESETS[name].to_dict(), **overrides})

    def describe(self) -> str:
        """One line for humans."""
        gqa = f", {self.kv_heads} kv heads" if self.kv_heads != self.heads else ""
        return (f"{self.name}: {self.params() / 1e9:.3g}B parameters, {self.layers} layers, hidden "
                f"{self.hidden}, {self.heads} heads{gqa}, ffn {self.ffn}"
                f"{' (gated)' if self.gated_mlp else ''}, "
                f"seq {self.seq}, vocab {self.vocab}, {self.precision}")


def _gpt(name: str, layers: int, hidden: int, heads: int, seq: int = 2048, vocab: int = 51200) -> Transformer:
    return Transformer(name=name, layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab)


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, seq: int = 4096,
           vocab: int = 32000) -> Transformer:
    return Transformer(name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv, ffn=ffn, seq=seq,
                       vocab=vocab, tied=False, gated_mlp=True, bias=False, positions=False)


#: named shapes: GPT-2 (Radford et al. 2019), GPT-3 (Brown et al. 2020, Table 2.1), Llama 2 (Touvron et
#: al. 2023, Table 1 and the released configs)
PRESETS: dict[str, Transformer] = {
    "gpt2-small": _gpt("gpt2-small", 12, 768, 12, seq=1024, vocab=50257),
    "gpt2-xl": _gpt("gpt2-xl", 48, 1600, 25, seq=1024, vocab=50257),
    "gpt3-1.3b": _gpt("gpt3-1.3b", 24, 2048, 16),
    "gpt3-6.7b": _gpt("gpt3-6.7b", 32, 4096, 32),
    "gpt3-13b": _gpt("gpt3-13b", 40, 5120, 40),
    "gpt3-175b": _gpt("gpt3-175b", 96, 12288, 96),
    "llama2-7b": _llama("llama2-7b", 32, 4096, 32, 32, 11008),
    "llama2-13b": _llama("llama2-13b", 40, 5120, 40, 40, 13824),
    "llama2-70b": _llama("llama2-70b", 80, 8192, 64, 8, 28672),
}


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive integers."""
    return -(-a // b)


__all__ = ["Matmul", "PRECISION_BYTES", "PRESETS", "Transformer", "ceil_div"]
