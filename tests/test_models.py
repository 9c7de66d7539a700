"""The model zoo: parameter counts against closed forms and the papers, fx-traceability, data."""

from __future__ import annotations

import pytest
import torch

import pipelab as pl
from pipelab.graph import build_stage, layer_nodes, trace
from pipelab.models import (
    build,
    digits_data,
    example,
    gnmt,
    gnmt_param_count,
    mlp,
    small_cnn,
    synthetic_translation,
    tiny_transformer,
)
from pipelab.models.demo import batches
from pipelab.models.gnmt import lstm_param_count
from pipelab.profile.pipedream_format import load_pipedream, shipped


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_lstm_formula_matches_torch() -> None:
    for i, h, d in [(3, 5, 1), (7, 4, 2), (2048, 1024, 1)]:
        assert lstm_param_count(i, h, d) == _count(torch.nn.LSTM(i, h, bidirectional=d == 2))


@pytest.mark.parametrize("layers", [8, 16])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("share", [True, False])
def test_gnmt_param_count_matches_hand_formula(layers: int, normalize: bool, share: bool) -> None:
    model = gnmt(layers, vocab=100, hidden=32, normalize_attention=normalize, share_embedding=share)
    # Written out for hidden H=32, vocab V=100 (4H(in+H) + 8H per LSTM direction):
    H, V, E = 32, 100, layers // 2
    lstm = lambda i: 4 * H * (i + H) + 8 * H  # noqa: E731
    expected = ((1 if share else 2) * V * H                      # embeddings
                + 2 * lstm(H) + lstm(2 * H) + (E - 2) * lstm(H)  # bidirectional 1st, 2H->H 2nd, residual rest
                + lstm(H) + 2 * H * H + H + ((H + 1) if normalize else 0)  # attention LSTM + Bahdanau
                + (E - 1) * lstm(2 * H)                          # decoder layers take [x; context]
                + H * V + V)                                     # classifier
    assert _count(model) == expected == gnmt_param_count(layers, 100, 32, share_embedding=share,
                                                         normalize_attention=normalize)


@pytest.mark.parametrize("name,layers", [("gnmt8", 8), ("gnmt16", 16)])
def test_full_size_gnmt_matches_pipedream_parameter_sizes(name: str, layers: int) -> None:
    # PipeDream's profiles (vocab 32320, hidden 1024, separate embeddings, unnormalized attention)
    # list parameter_size per node; our closed form reproduces their sum to the byte.
    total = gnmt_param_count(layers, 32320, 1024, normalize_attention=False)
    print(f"{name}: {total:,} parameters (PipeDream profile), "
          f"{gnmt_param_count(layers, 32000, 1024):,} at vocab 32000 with normalized attention")
    assert 4 * total == load_pipedream(shipped(name)).param_bytes


def test_gnmt_is_traceable_and_traced_equals_eager() -> None:
    torch.manual_seed(0)
    model = gnmt(8, vocab=50, hidden=16).eval()
    src, tgt_in, tgt_out = synthetic_translation(3, vocab=50, src_len=5, min_len=2)
    gm = trace(model)
    assert sum(1 for n in layer_nodes(gm) if n.op == "call_module" and "LSTM" in type(
        gm.get_submodule(str(n.target))).__name__) == 8
    out = model(src, tgt_in)
    assert out.shape == (3, 5, 50)
    assert torch.allclose(gm(src, tgt_in), out)
    n = len(layer_nodes(gm))
    a, b = build_stage(gm, 0, n // 2), build_stage(gm, n // 2, n)
    assert torch.allclose(b(*a(src, tgt_in)), out, atol=1e-6)
    with pytest.raises(ValueError, match="even"):
        gnmt(7)


def test_gnmt_learns_the_toy_translation() -> None:
    torch.manual_seed(0)
    model = gnmt(4, vocab=12, hidden=32, dropout=0.0)
    src, tgt_in, tgt_out = synthetic_translation(32, vocab=12, src_len=4, seed=1)
    opt = torch.optim.Adam(model.parameters(), lr=2e-2)
    losses = []
    for _ in range(80):
        loss = torch.nn.functional.cross_entropy(
            model(src, tgt_in).flatten(0, 1), tgt_out.flatten(), ignore_index=0
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.25 * losses[0], losses[::10]


def test_synthetic_translation_is_reverse_through_a_dictionary() -> None:
    src, tgt_in, tgt_out = synthetic_translation(20, vocab=30, src_len=6, min_len=3, seed=3)
    mapping: dict[int, int] = {}
    for s, t_in, t_out in zip(src, tgt_in, tgt_out):
        k = int((s != 0).sum())
        assert torch.all(s[k:] == 0) and torch.all(t_out[k:] == 0) and 3 <= k <= 6
        for a, b in zip(s[:k].flip(0).tolist(), t_out[:k].tolist()):
            assert mapping.setdefault(a, b) == b  # one fixed dictionary
        assert t_in[0] == 1 and torch.equal(t_in[1:], t_out[:-1])
    assert len(set(mapping.values())) == len(mapping)  # a bijection on the words seen


def test_demo_models_and_digits() -> None:
    x, y = digits_data()
    assert x.shape == (1797, 1, 8, 8) and y.shape == (1797,) and 0 <= float(x.min()) and float(x.max()) <= 1
    xtr, ytr = digits_data("train")
    xte, yte = digits_data("test")
    assert len(ytr) + len(yte) == 1797 and set(yte.tolist()) == set(range(10))
    assert small_cnn()(xtr[:5]).shape == (5, 10)
    assert mlp()(digits_data(flat=True)[0][:5]).shape == (5, 10)
    assert tiny_transformer(vocab=20)(torch.randint(0, 20, (2, 9))).shape == (2, 9, 20)
    for name in ("mlp", "small_cnn", "tiny_transformer"):
        model, sample = example(name, 3)
        prof = pl.profile(model, sample, warmup=0, repeats=1, progress=False)
        assert prof.param_bytes == 4 * _count(model) and prof.batch_size == 3
    assert [len(b[0]) for b in batches((xtr[:10], ytr[:10]), 4)] == [4, 4, 2]
    with pytest.raises(ValueError, match="unknown model"):
        build("bert")


def test_vision_models_param_counts() -> None:
    # VGG-16's count (138,357,544) is checked through the profiler in test_profiler.py.
    assert _count(build("resnet50")) == 25_557_032
    assert pl.models.pipedream_profile("vgg16").param_bytes == 4 * 138_357_544


def test_gpt_tied_head_and_data() -> None:
    from pipelab.models import gpt, gpt_data, gpt_loss

    tied, untied = gpt(seed=0), gpt(seed=0, tied=False)
    assert tied.tied and tied.head.weight is tied.wte.weight and not untied.tied
    # one matrix fewer: the closed form of the difference is vocab x d_model
    assert _count(untied) - _count(tied) == 97 * 32
    tokens, targets = gpt_data(5, seed=3)
    assert tokens.shape == targets.shape == (5, 16) and torch.equal(tokens[:, 1:], targets[:, :-1])
    assert torch.equal(gpt_data(5, seed=3)[0], tokens) and int(tokens.max()) < 97
    logits = tied(tokens)
    assert logits.shape == (5, 16, 97)
    # causal: changing the last token leaves earlier positions' logits unchanged
    other = tokens.clone()
    other[:, -1] = (other[:, -1] + 1) % 97
    assert torch.allclose(tied(other)[:, :-1], logits[:, :-1]) and not torch.allclose(tied(other), logits)
    assert torch.isclose(gpt_loss(logits, targets), torch.nn.functional.cross_entropy(
        logits.reshape(-1, 97), targets.reshape(-1)))
    trace(tied)  # nanoGPT-style blocks (b, s, _ = x.shape) trace with fx
