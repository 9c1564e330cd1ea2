"""An image classifier around a separate backbone network, with accuracy, a scheduler and early stopping."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import gpulayer.trainer as L
from gpulayer.trainer.callbacks import EarlyStopping, ModelCheckpoint

SEED = 42
CLASSES = 3


def striped_images(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Noisy 12x12 images of horizontal, vertical or diagonal stripes; the label is the direction."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (count,), generator=g)
    ys, xs = torch.meshgrid(torch.arange(12.0), torch.arange(12.0), indexing="ij")
    patterns = torch.stack([torch.sin(ys * 1.5), torch.sin(xs * 1.5), torch.sin((xs + ys) * 1.1)])
    images = patterns[labels] + 0.8 * torch.randn(count, 12, 12, generator=g)
    return images[:, None], labels


class Backbone(nn.Module):
    def __init__(self, channels: int = 8):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.out_features = channels

    def forward(self, x):
        return self.features(x)


class Classifier(L.LightningModule):
    def __init__(self, backbone: nn.Module, lr: float = 0.02):
        super().__init__()
        self.save_hyperparameters(ignore=["backbone"])
        self.backbone = backbone
        self.head = nn.Linear(backbone.out_features, CLASSES)

    def forward(self, x):
        return self.head(self.backbone(x))

    def _step(self, batch, stage):
        images, labels = batch
        logits = self(images)
        loss = F.cross_entropy(logits, labels)
        accuracy = (logits.argmax(-1) == labels).float().mean()
        # Synced across devices outside training, so every rank checkpoints and stops on the same numbers.
        self.log_dict({f"{stage}_loss": loss, f"{stage}_acc": accuracy}, prog_bar=stage != "test",
                      sync_dist=stage != "train")
        return loss

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx):
        self._step(batch, "val")

    def test_step(self, batch, batch_idx):
        self._step(batch, "test")

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        images, _ = batch
        return self(images).softmax(-1)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}


def loaders(batch_size: int = 16):
    train = TensorDataset(*striped_images(192, seed=1))
    held_out = TensorDataset(*striped_images(64, seed=2))
    return (DataLoader(train, batch_size=batch_size, shuffle=True), DataLoader(held_out, batch_size=batch_size),
            DataLoader(TensorDataset(*striped_images(50, seed=3)), batch_size=batch_size))


def fit(root, **trainer_kwargs):
    L.seed_everything(SEED)
    train, val, test = loaders()
    model = Classifier(Backbone())
    callbacks = [ModelCheckpoint(monitor="val_acc", mode="max"), EarlyStopping(monitor="val_loss", patience=2)]
    trainer = L.Trainer(max_epochs=4, default_root_dir=root, callbacks=callbacks, **trainer_kwargs)
    trainer.fit(model, train, val)
    return model, trainer, test


def evaluate(model, trainer, test):
    tested = trainer.test(model, test, ckpt_path="best", verbose=False)
    predicted = trainer.predict(model, test, ckpt_path="best")
    return tested, predicted
