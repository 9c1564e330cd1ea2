"""A plain ``pip install gpulayer`` has no numpy: ``Trainer(devices=2)`` on CPU must still run.

The fit runs in a fresh interpreter whose ``import numpy`` fails (a stub package
first on the path, which the rank processes inherit), as in an environment where
numpy was never installed; torch then reports "Numpy is not available" from any
call that needs it (``broadcast_object_list`` did).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import sys
    try:
        import numpy
    except ImportError:
        pass
    else:
        sys.exit("numpy is importable: the stub did not take effect")
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from gpulayer.trainer import LightningModule, Trainer, seed_everything

    class Net(LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("loss", loss, sync_dist=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def loader():
        g = torch.Generator().manual_seed(0)
        return DataLoader(TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g)), batch_size=8)

    if __name__ == "__main__":
        seed_everything(0)
        trainer = Trainer(max_epochs=2, devices=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(Net(), loader)
        print("OK", trainer.global_step, trainer.fit_info["grad_sync"])
''')


def test_devices_2_on_cpu_without_numpy(tmp_path):
    stub = tmp_path / "no_numpy" / "numpy"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'numpy' (test stub)\", name='numpy')\n")
    script = tmp_path / "fit_without_numpy.py"
    script.write_text(SCRIPT)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(stub.parent), repo]))
    proc = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Numpy is not available" not in proc.stderr
    assert proc.stdout.split()[-3:-1] == ["OK", "8"], proc.stdout
