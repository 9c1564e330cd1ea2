"""A small LSTM language model on ``WikiText2``, at Lightning's import path (``lightning.pytorch.demos``).

Same names, constructor arguments, parameter shapes and initial draws as Lightning's demo,
so a seeded run gives the same weights under either Trainer. Like ``WikiText2`` here, it
never reaches the network (see ``gpulayer.trainer.demos.transformer.WikiText2``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sized

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.utils.data import DataLoader, Sampler

from gpulayer.trainer.demos.transformer import WIKITEXT2_VOCAB, WikiText2
from gpulayer.trainer.module import LightningModule

__all__ = ["LightningLSTM", "SequenceSampler", "SimpleLSTM"]


class SimpleLSTM(nn.Module):
    """Embedding, a stacked ``nn.LSTM`` (batch first) and a linear decoder, returning log-probabilities.

    ``forward(input, hidden)`` returns ``((batch * time, vocab_size) log-probabilities, new hidden)``;
    ``init_hidden(batch_size)`` gives the zero state to start from.
    """

    def __init__(self, vocab_size: int = WIKITEXT2_VOCAB, ninp: int = 512, nhid: int = 512, nlayers: int = 4,
                 dropout: float = 0.2):
        super().__init__()
        self.vocab_size = vocab_size
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab_size, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout, batch_first=True)
        self.decoder = nn.Linear(nhid, vocab_size)
        self.nlayers = nlayers
        self.nhid = nhid
        self.init_weights()

    def init_weights(self) -> None:
        """Embedding and decoder weights uniform in [-0.1, 0.1], decoder bias zero (the LSTM keeps torch's init)."""
        # Drawn in this order (embedding, then decoder) so a seed gives Lightning's demo's weights.
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, input: Tensor, hidden: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        output, hidden = self.rnn(self.drop(self.encoder(input)), hidden)
        logits = self.decoder(self.drop(output)).view(-1, self.vocab_size)
        return F.log_softmax(logits, dim=1), hidden

    def init_hidden(self, batch_size: int) -> tuple[Tensor, Tensor]:
        like = next(self.parameters())  # the model's device and dtype
        shape = (self.nlayers, batch_size, self.nhid)
        return like.new_zeros(shape), like.new_zeros(shape)


class SequenceSampler(Sampler[list[int]]):
    """Batches that continue each other: row ``j`` of batch ``i + 1`` is the block after row ``j`` of batch ``i``.

    The dataset is cut into ``batch_size`` contiguous streams of ``len(dataset) // batch_size``
    blocks; batch ``i`` holds block ``i`` of every stream. That lets an LSTM carry its hidden
    state from one batch to the next (truncated backpropagation through time). The blocks left
    over after the last full stream are not used.
    """

    def __init__(self, dataset: Sized, batch_size: int) -> None:
        super().__init__()
        self.dataset = dataset
        self.batch_size = batch_size
        self.chunk_size = len(self.dataset) // self.batch_size

    def __iter__(self) -> Iterator[list[int]]:
        for i in range(self.chunk_size):
            yield [i + stream * self.chunk_size for stream in range(self.batch_size)]

    def __len__(self) -> int:
        return self.chunk_size


class LightningLSTM(LightningModule):
    """``SimpleLSTM`` on ``WikiText2`` in streams of 20 (``SequenceSampler``), SGD with lr 20, as Lightning's demo.

    The hidden state carries over between batches (detached, so gradients stop at the batch)
    and is reset at each epoch's end; ``train_loss`` is logged to the progress bar.
    """

    def __init__(self, vocab_size: int = WIKITEXT2_VOCAB):
        super().__init__()
        self.model = SimpleLSTM(vocab_size=vocab_size)
        self.hidden: tuple[Tensor, Tensor] | None = None

    def on_train_epoch_end(self) -> None:
        self.hidden = None

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        input, target = batch
        if self.hidden is None:
            self.hidden = self.model.init_hidden(input.size(0))
        carried = (self.hidden[0].detach(), self.hidden[1].detach())
        output, self.hidden = self.model(input, carried)
        loss = F.nll_loss(output, target.view(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def prepare_data(self) -> None:
        WikiText2(download=True)

    def train_dataloader(self) -> DataLoader:
        dataset = WikiText2()
        return DataLoader(dataset, batch_sampler=SequenceSampler(dataset, batch_size=20))

    def configure_optimizers(self) -> Optimizer:
        return torch.optim.SGD(self.parameters(), lr=20.0)
