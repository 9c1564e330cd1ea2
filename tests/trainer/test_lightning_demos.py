"""The demo modules Lightning users import (``lightning.pytorch.demos``) behave as Lightning's do.

Same seed, same weights: each demo is built and trained under gpulayer's Trainer and under
Lightning 2.6.6 with Lightning's own demo, and the weights are compared bit for bit.
"""

from __future__ import annotations


import pytest
import torch
from torch.utils.data import DataLoader

import gpulayer.trainer as gl
from gpulayer.trainer.demos import transformer as ours
from gpulayer.trainer.demos.lstm import LightningLSTM, SequenceSampler
from tests.trainer.twin import needs_lightning

QUIET = dict(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
             enable_checkpointing=False)


def _assert_identical(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), f"{k} differs: max |diff| {(sa[k] - sb[k]).abs().max():.3g}"


def test_wikitext2_writes_a_deterministic_corpus_offline_when_the_file_is_absent(tmp_path):
    torch.manual_seed(0)
    before = torch.random.get_rng_state()
    first = ours.WikiText2(data_dir=tmp_path / "a")
    assert torch.equal(torch.random.get_rng_state(), before), "the corpus must not consume the global random state"
    second = ours.WikiText2(data_dir=tmp_path / "b", block_size=10)
    assert (tmp_path / "a" / "wikitext-2.txt").read_text() == (tmp_path / "b" / "wikitext-2.txt").read_text()
    assert torch.equal(first.data, second.data) and first.vocab_size == second.vocab_size > 100
    assert len(first) == len(first.data) // 35 - 1
    inputs, target = first[3]
    assert inputs.shape == target.shape == (35,) and inputs.dtype == torch.int64
    assert torch.equal(inputs[1:], target[:-1]), "the target is the input shifted by one token"


def test_wikitext2_reads_an_existing_file_as_is_and_without_download_names_a_missing_one(tmp_path):
    (tmp_path / "wikitext-2.txt").write_text("the cat sat\nthe dog\n")
    data = ours.WikiText2(data_dir=tmp_path, block_size=2)
    assert data.dictionary.idx2word == ["the", "cat", "sat", "<eos>", "dog"]
    assert data.data.tolist() == [0, 1, 2, 3, 0, 4, 3]
    assert len(data) == 2 and data[1][0].tolist() == [2, 3] and data[1][1].tolist() == [3, 0]
    with pytest.raises(FileNotFoundError, match="download=True"):
        ours.WikiText2(data_dir=tmp_path / "missing", download=False)


def test_transformer_returns_log_probabilities_per_token():
    model = ours.Transformer(vocab_size=30, ninp=8, nhead=2, nhid=16, nlayers=1).eval()
    out = model(torch.randint(0, 30, (3, 7)), torch.randint(0, 30, (3, 7)))
    assert out.shape == (21, 30)
    torch.testing.assert_close(out.exp().sum(-1), torch.ones(21))
    mask = model.generate_square_subsequent_mask(3)
    assert mask.tolist() == [[0.0, float("-inf"), float("-inf")], [0.0, 0.0, float("-inf")], [0.0, 0.0, 0.0]]


def test_sequence_sampler_batches_continue_each_other():
    batches = list(SequenceSampler(range(11), batch_size=3))
    assert batches == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]  # three streams of three blocks; 9 and 10 are left over
    assert len(SequenceSampler(range(11), batch_size=3)) == 3


@needs_lightning
def test_demo_classes_match_lightnings_names_and_signatures():
    import inspect

    import lightning.pytorch.demos as theirs
    import lightning.pytorch.demos.transformer as their_transformer

    import gpulayer.trainer.demos as mine
    def arguments(obj):  # names and defaults; annotations are strings here (postponed evaluation)
        return [(p.name, p.default) for p in inspect.signature(obj).parameters.values()]

    assert set(theirs.__all__) <= set(mine.__all__)
    for name in theirs.__all__:
        assert arguments(getattr(theirs, name)) == arguments(getattr(mine, name)), name
    for name in ("PositionalEncoding", "Dictionary", "tokenize"):
        assert arguments(getattr(their_transformer, name)) == arguments(getattr(ours, name)), name


def _offline(cls: type) -> type:
    """The demo without its ``prepare_data``: Lightning's downloads (it needs ``requests`` and the network)."""
    return type("Offline" + cls.__name__, (cls,), {"prepare_data": lambda self: None})


@needs_lightning
def test_lightning_transformer_trains_to_lightnings_weights(tmp_path):
    import lightning.pytorch as pl
    from lightning.pytorch.demos.transformer import LightningTransformer as Theirs

    data = ours.WikiText2(data_dir=tmp_path, block_size=12)  # written once, read by both runs
    models = []
    for pkg, cls in ((gl, ours.LightningTransformer), (pl, Theirs)):
        pkg.seed_everything(3)
        model = _offline(cls)(vocab_size=data.vocab_size)
        pkg.Trainer(max_steps=6, default_root_dir=tmp_path, **QUIET).fit(model, DataLoader(data, batch_size=4))
        models.append(model)
    _assert_identical(*models)


@needs_lightning
def test_lightning_lstm_trains_to_lightnings_weights(tmp_path, monkeypatch):
    import lightning.pytorch as pl
    from lightning.pytorch.demos.lstm import LightningLSTM as Theirs

    monkeypatch.chdir(tmp_path)  # the demo reads ./data/wikitext-2.txt, as Lightning's does
    ours_loader = LightningLSTM(vocab_size=10).train_dataloader()
    assert len(ours_loader) == len(ours_loader.dataset) // 20 and (tmp_path / "data" / "wikitext-2.txt").exists()
    # Lightning's own train_dataloader would try to download: it gets the same loader, built here.
    models = []
    for pkg, cls in ((gl, LightningLSTM), (pl, Theirs)):
        pkg.seed_everything(5)
        model = _offline(cls)(vocab_size=1000)
        loader = DataLoader(ours_loader.dataset, batch_sampler=SequenceSampler(ours_loader.dataset, batch_size=20))
        pkg.Trainer(max_steps=1, default_root_dir=tmp_path, **QUIET).fit(model, loader)  # a step is seconds on CPU
        models.append(model)
    _assert_identical(*models)
