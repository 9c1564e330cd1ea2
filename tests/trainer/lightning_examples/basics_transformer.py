"""Lightning's examples/pytorch/basics/transformer.py, ported by changing its imports only.

``LanguageModel`` is Lightning's, verbatim (it uses ``demos.Transformer``).
``WikiText2`` downloads its text; ``SyntheticText`` gives token windows of the
same form (inputs and next-token targets of ``block_size``) from a small vocabulary.
"""

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, random_split

import gpulayer.trainer as L
from gpulayer.trainer.demos import Transformer


class LanguageModel(L.LightningModule):
    def __init__(self, vocab_size):
        super().__init__()
        self.model = Transformer(vocab_size=vocab_size)

    def training_step(self, batch, batch_idx):
        input, target = batch
        output = self.model(input, target)
        loss = F.nll_loss(output, target.view(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        input, target = batch
        output = self.model(input, target)
        loss = F.nll_loss(output, target.view(-1))
        self.log("val_loss", loss, prog_bar=True)
        return loss

    def test_step(self, batch, batch_idx):
        input, target = batch
        output = self.model(input, target)
        loss = F.nll_loss(output, target.view(-1))
        self.log("test_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class SyntheticText(Dataset):
    """WikiText2's item form: (tokens[i:i+block], tokens[i+1:i+1+block])."""

    def __init__(self, n_tokens: int = 2000, vocab_size: int = 50, block_size: int = 35) -> None:
        self.data = torch.randint(0, vocab_size, (n_tokens,), generator=torch.Generator().manual_seed(7))
        self.vocab_size, self.block_size = vocab_size, block_size

    def __len__(self) -> int:
        return len(self.data) // self.block_size - 1

    def __getitem__(self, index: int):
        start = index * self.block_size
        end = start + self.block_size
        return self.data[start:end], self.data[start + 1:end + 1]


def main(**trainer_kwargs):
    L.seed_everything(42)
    dataset = SyntheticText()
    n = len(dataset)
    train_dataset, val_dataset, test_dataset = random_split(dataset, [n - 16, 8, 8])
    train_dataloader = DataLoader(train_dataset, batch_size=20, shuffle=True)
    val_dataloader = DataLoader(val_dataset, batch_size=20, shuffle=False)
    test_dataloader = DataLoader(test_dataset, batch_size=20, shuffle=False)
    model = LanguageModel(vocab_size=dataset.vocab_size)
    trainer = L.Trainer(gradient_clip_val=0.25, **trainer_kwargs)
    trainer.fit(model, train_dataloader, val_dataloader)
    results = trainer.test(model, test_dataloader)
    return model, trainer, results
