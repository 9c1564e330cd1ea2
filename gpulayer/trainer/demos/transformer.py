"""A small transformer language model and its dataset, at Lightning's import path.

Lightning users import ``Transformer``, ``LightningTransformer`` and ``WikiText2`` from
``lightning.pytorch.demos`` (``PositionalEncoding``, ``Dictionary`` and ``tokenize`` from
``lightning.pytorch.demos.transformer``). These have the same names, constructor arguments,
parameter shapes and random draws, so the same seed gives the same weights and losses
under either Trainer.

The one deliberate difference: gpulayer never reaches the network. ``WikiText2`` reads the
same file Lightning downloads (``<data_dir>/wikitext-2.txt``); when that file is absent it
writes a small synthetic corpus in its place instead of downloading (see ``WikiText2``).

>>> from gpulayer.trainer import Trainer                         # doctest: +SKIP
>>> from gpulayer.trainer.demos import LightningTransformer, WikiText2
>>> data = WikiText2(data_dir=Path("data"))                        # doctest: +SKIP
>>> model = LightningTransformer(vocab_size=data.vocab_size)        # doctest: +SKIP
>>> Trainer(max_steps=100).fit(model, DataLoader(data))            # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from gpulayer.trainer.module import LightningModule

__all__ = ["Dictionary", "LightningTransformer", "PositionalEncoding", "Transformer", "WikiText2", "tokenize"]

WIKITEXT2_VOCAB = 33278  # words in WikiText-2's training split (with <eos>): the default vocabulary size
EOS = "<eos>"


class PositionalEncoding(nn.Module):
    """Adds a fixed sinusoidal encoding to token embeddings, then applies dropout.

    The table (``max_len`` rows of ``dim`` sines and cosines) is built on the first call,
    on the input's device, and kept as a plain attribute: not a buffer, so it is neither in
    the ``state_dict`` nor in a checkpoint, which keeps checkpoints the same as Lightning's.

    Every token of a sequence of length ``t`` gets the encoding of row ``t``: Lightning's demo
    indexes the table that way, and its users' losses depend on it, so it is kept here.
    """

    def __init__(self, dim: int, dropout: float = 0.1, max_len: int = 5000) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        self.dim = dim
        self.max_len = max_len
        self.pe: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        if self.pe is None or self.pe.device != x.device:
            self.pe = self._table(x.device)
        return self.dropout(x + self.pe[:, x.size(1)])

    def _table(self, device: torch.device) -> Tensor:
        positions = torch.arange(self.max_len, dtype=torch.float, device=device)[:, None]
        rates = torch.exp(torch.arange(0, self.dim, 2, device=device).float() * (-math.log(10000.0) / self.dim))
        table = torch.zeros(self.max_len, self.dim, device=device)
        table[:, 0::2] = torch.sin(positions * rates)
        table[:, 1::2] = torch.cos(positions * rates)
        return table[None]  # a leading batch dimension, to broadcast over the batch


def causal_mask(size: int, device: torch.device | None = None) -> Tensor:
    """A ``size x size`` additive mask: 0 on and below the diagonal, ``-inf`` above (no peeking ahead)."""
    return torch.full((size, size), float("-inf"), device=device).triu(diagonal=1)


class Transformer(nn.Module):
    """An encoder-decoder ``nn.Transformer`` over word embeddings, returning log-probabilities.

    ``forward(inputs, target)`` takes two ``(batch, time)`` tensors of token ids and returns
    ``(batch * time, vocab_size)`` log-probabilities, ready for ``F.nll_loss(out, target.view(-1))``.
    The decoder sees ``target`` through a causal mask (or the ``mask`` given).
    """

    def __init__(self, vocab_size: int = WIKITEXT2_VOCAB, ninp: int = 200, nhead: int = 2, nhid: int = 200,
                 nlayers: int = 2, dropout: float = 0.2) -> None:
        super().__init__()
        # Submodules are built in this order so their initial weights take the same random
        # draws as Lightning's demo for the same seed.
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        self.embedding = nn.Embedding(vocab_size, ninp)
        self.transformer = nn.Transformer(d_model=ninp, nhead=nhead, num_encoder_layers=nlayers,
                                          num_decoder_layers=nlayers, dim_feedforward=nhid, dropout=dropout,
                                          batch_first=True)
        self.decoder = nn.Linear(ninp, vocab_size)
        self.ninp = ninp
        self.vocab_size = vocab_size
        self.src_mask: Tensor | None = None

    def generate_square_subsequent_mask(self, size: int) -> Tensor:
        """The causal mask for a sequence of ``size`` tokens (``-inf`` where a token would see the future)."""
        return causal_mask(size)

    def forward(self, inputs: Tensor, target: Tensor, mask: Tensor | None = None) -> Tensor:
        length = inputs.shape[1]
        if self.src_mask is None or self.src_mask.size(0) != length:
            self.src_mask = causal_mask(length, inputs.device)  # kept for users who read it; the encoder sees all
        if mask is None:
            mask = causal_mask(length, inputs.device)
        scale = math.sqrt(self.ninp)
        src = self.pos_encoder(self.embedding(inputs) * scale)
        tgt = self.pos_encoder(self.embedding(target) * scale)
        hidden = self.transformer(src, tgt, tgt_mask=mask)
        return F.log_softmax(self.decoder(hidden), dim=-1).view(-1, self.vocab_size)


class Dictionary:
    """Words to ids and back, ids given in order of first appearance."""

    def __init__(self) -> None:
        self.word2idx: dict[str, int] = {}
        self.idx2word: list[str] = []

    def add_word(self, word: str) -> int:
        """The word's id, adding it with the next id if it is new."""
        idx = self.word2idx.get(word)
        if idx is None:
            idx = self.word2idx[word] = len(self.idx2word)
            self.idx2word.append(word)
        return idx

    def __len__(self) -> int:
        return len(self.idx2word)


def tokenize(path: Path) -> tuple[Tensor, Dictionary]:
    """The file's words as one int64 tensor of ids (each line ends with ``<eos>``), and their dictionary."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} does not exist; put a text file there, or build WikiText2(download=True), "
                                f"which writes a synthetic corpus when the real one is absent")
    dictionary = Dictionary()
    with open(path, encoding="utf8") as f:
        ids = [dictionary.add_word(word) for line in f for word in (*line.split(), EOS)]
    return torch.tensor(ids, dtype=torch.int64), dictionary


def synthetic_corpus(lines: int = 2000, vocab: int = 1000, seed: int = 0) -> str:
    """A deterministic stand-in for WikiText-2: ``lines`` lines of made-up words.

    Word frequencies fall off as in natural text (Zipf-like) and consecutive words depend on
    each other, so a language model has something to learn. It uses its own generator: the
    global random state (and so a seeded run's weights) is the same whether or not it runs.
    """
    gen = torch.Generator().manual_seed(seed)
    words = [f"w{i}" for i in range(vocab)]
    zipf = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64)
    out = []
    for _ in range(lines):
        length = int(torch.randint(5, 25, (1,), generator=gen))
        picks = torch.multinomial(zipf, length, replacement=True, generator=gen)
        # Every other word follows from the one before it: a pattern the model can learn.
        picks[1::2] = (picks[0:-1:2] * 7 + 1) % vocab
        out.append(" ".join(words[i] for i in picks.tolist()))
    return "\n".join(out) + "\n"


class WikiText2(Dataset):
    """WikiText-2's training text as ``(inputs, target)`` blocks of ``block_size`` tokens, ``target`` shifted by one.

    The text is read from ``data_dir / "wikitext-2.txt"``, the file Lightning's ``WikiText2``
    downloads. **Offline here**: gpulayer makes no network requests, so ``download=True``
    does not fetch WikiText-2; when the file is absent it writes ``synthetic_corpus()`` there
    (2,000 deterministic lines of made-up words, vocabulary about 1,000), and the same code
    path tokenizes it. To train on the real text, put WikiText-2's ``train.txt`` at that path
    first: it is then read as is. ``download=False`` reads the file and fails, naming the
    path, if it is missing.
    """

    def __init__(self, data_dir: Path = Path("./data"), block_size: int = 35, download: bool = True) -> None:
        super().__init__()
        self.path = Path(data_dir) / "wikitext-2.txt"
        if download:
            self.download(self.path)
        self.data, self.dictionary = tokenize(self.path)
        self.block_size = block_size

    @property
    def vocab_size(self) -> int:
        return len(self.dictionary)

    def __len__(self) -> int:
        # The last full block has no next token for its target, hence the minus one.
        return len(self.data) // self.block_size - 1

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        start = index * self.block_size
        return self.data[start:start + self.block_size], self.data[start + 1:start + self.block_size + 1]

    @staticmethod
    def download(destination: Path) -> None:
        """Make sure ``destination`` holds a corpus: kept if present, else the synthetic one is written.

        Written to a temporary name and renamed, so ranks that call this at once never read half a file.
        """
        destination = Path(destination)
        if destination.exists():
            return
        destination.parent.mkdir(parents=True, exist_ok=True)
        partial = destination.with_name(f"{destination.name}.{os.getpid()}.partial")
        partial.write_text(synthetic_corpus(), encoding="utf8")
        os.replace(partial, destination)


class LightningTransformer(LightningModule):
    """``Transformer`` trained on ``WikiText2`` with SGD (lr 0.1), as Lightning's demo is.

    ``training_step`` returns the negative log-likelihood of the next token; there is no
    validation. ``prepare_data`` and ``train_dataloader`` use ``WikiText2()`` in ``./data``
    (batch size 1); pass your own loader to ``fit`` to train on other data.
    """

    def __init__(self, vocab_size: int = WIKITEXT2_VOCAB) -> None:
        super().__init__()
        self.model = Transformer(vocab_size=vocab_size)

    def forward(self, inputs: Tensor, target: Tensor) -> Tensor:
        return self.model(inputs, target)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        inputs, target = batch
        return F.nll_loss(self(inputs, target), target.view(-1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.model.parameters(), lr=0.1)

    def prepare_data(self) -> None:
        WikiText2(download=True)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(WikiText2())
