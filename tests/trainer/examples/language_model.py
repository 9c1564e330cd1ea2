"""A next-word language model on the demo ``Transformer`` and ``WikiText2`` (its offline corpus here)."""

from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset

import gpulayer.trainer as L
from gpulayer.trainer.demos import Transformer, WikiText2

SEED = 7


class WikiData(L.LightningDataModule):
    def __init__(self, data_dir, block_size: int = 16, batch_size: int = 8):
        super().__init__()
        self.data_dir, self.block_size, self.batch_size = Path(data_dir), block_size, batch_size

    def prepare_data(self):
        if not (self.data_dir / "wikitext-2.txt").exists():
            WikiText2(self.data_dir, download=True)

    def setup(self, stage):
        text = WikiText2(self.data_dir, block_size=self.block_size, download=False)
        self.vocab_size = text.vocab_size
        # Contiguous stretches of the text: 96 blocks to train on, 16 to validate, 16 to test.
        self.train_set = Subset(text, range(0, 96))
        self.val_set = Subset(text, range(96, 112))
        self.test_set = Subset(text, range(112, 128))

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size)

    def test_dataloader(self):
        return DataLoader(self.test_set, batch_size=self.batch_size)

    def predict_dataloader(self):
        return DataLoader(self.test_set, batch_size=self.batch_size)


class LanguageModel(L.LightningModule):
    def __init__(self, vocab_size: int, width: int = 32):
        super().__init__()
        self.save_hyperparameters()
        self.model = Transformer(vocab_size=vocab_size, ninp=width, nhead=2, nhid=2 * width, nlayers=1, dropout=0.1)

    def _loss(self, batch):
        inputs, target = batch
        return F.nll_loss(self.model(inputs, target), target.view(-1))

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self._loss(batch), prog_bar=True, sync_dist=True)

    def test_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("test_loss", loss, sync_dist=True)
        self.log("test_perplexity", loss.exp(), sync_dist=True)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        inputs, target = batch
        return self.model(inputs, target).argmax(-1).view_as(target)  # the most likely next words

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def fit(root, **trainer_kwargs):
    L.seed_everything(SEED)
    data = WikiData(Path(root) / "data")
    data.prepare_data()
    data.setup("fit")
    model = LanguageModel(data.vocab_size)
    trainer = L.Trainer(max_epochs=2, gradient_clip_val=0.25, default_root_dir=root, **trainer_kwargs)
    trainer.fit(model, datamodule=data)
    return model, trainer, data


def evaluate(model, trainer, data):
    tested = trainer.test(ckpt_path="best", datamodule=data, verbose=False)
    predicted = trainer.predict(ckpt_path="best", datamodule=data)
    return tested, predicted
