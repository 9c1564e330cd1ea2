"""An image autoencoder: encode 16x16 images to 4 numbers and back, with a datamodule that splits its data."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, random_split

import gpulayer.trainer as L
from gpulayer.trainer.callbacks import ModelCheckpoint

SEED = 1234


def blob_images(count: int, seed: int) -> torch.Tensor:
    """``count`` 16x16 images, each a soft bright spot at a random place and size: 4 numbers describe one."""
    g = torch.Generator().manual_seed(seed)
    centre = torch.rand(count, 2, generator=g) * 12 + 2
    width = torch.rand(count, 1, generator=g) * 2 + 1
    ys, xs = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    dist2 = (ys - centre[:, 0, None, None]) ** 2 + (xs - centre[:, 1, None, None]) ** 2
    return torch.exp(-dist2 / (2 * width[:, :, None] ** 2))[:, None]


class BlobData(L.LightningDataModule):
    def __init__(self, batch_size: int = 32, count: int = 480):
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage):
        images = TensorDataset(blob_images(self.hparams.count, seed=7))
        n = self.hparams.count
        self.train_set, self.val_set, self.test_set = random_split(
            images, [n - 2 * (n // 6), n // 6, n // 6], generator=torch.Generator().manual_seed(0))

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)

    def test_dataloader(self):
        return DataLoader(self.test_set, batch_size=self.hparams.batch_size)

    def predict_dataloader(self):
        return DataLoader(self.test_set, batch_size=self.hparams.batch_size)


class AutoEncoder(L.LightningModule):
    def __init__(self, latent: int = 4, hidden: int = 64, lr: float = 3e-3):
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Flatten(), nn.Linear(256, hidden), nn.ReLU(), nn.Linear(hidden, latent))
        self.decoder = nn.Sequential(nn.Linear(latent, hidden), nn.ReLU(), nn.Linear(hidden, 256), nn.Sigmoid())

    def forward(self, images):
        return self.decoder(self.encoder(images)).view_as(images)

    def _loss(self, batch):
        (images,) = batch
        return F.mse_loss(self(images), images)

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("train_loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self._loss(batch), prog_bar=True, sync_dist=True)

    def test_step(self, batch, batch_idx):
        self.log("test_loss", self._loss(batch), sync_dist=True)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        (images,) = batch
        return self.encoder(images)  # the codes

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def fit(root, **trainer_kwargs):
    L.seed_everything(SEED)
    model, data = AutoEncoder(), BlobData()
    best = ModelCheckpoint(monitor="val_loss", save_top_k=2, filename="{epoch}-{val_loss:.4f}")
    trainer = L.Trainer(max_epochs=3, default_root_dir=root, callbacks=[best], **trainer_kwargs)
    trainer.fit(model, datamodule=data)
    return model, trainer, data


def evaluate(model, trainer, data):
    tested = trainer.test(ckpt_path="best", datamodule=data, verbose=False)
    predicted = trainer.predict(ckpt_path="best", datamodule=data)
    return tested, predicted
