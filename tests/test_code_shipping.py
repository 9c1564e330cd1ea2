"""The user's code travels: a project's modules reach workers started elsewhere (gpulayer/workspace/).

The scripts run as their own processes from a project directory that holds ``mylib.py``; the workers
were started in another directory, as ``gpulayer up`` or a real fleet's are, so ``import mylib`` works
on them only through the shipped archive.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpulayer.workspace import archive, roots
from tests.fleets import running_fleet

MYLIB = textwrap.dedent("""
    VALUE = 7

    class Box:
        def __init__(self, n):
            self.n = n

    def double(x):
        return 2 * x
""")

JOBS = textwrap.dedent("""
    import json, os, sys
    import gpulayer
    from gpulayer import submit, submit_batch, distributed, JobFailed

    def job(x):
        import mylib                      # imported on the worker, from the shipped code
        return mylib.double(x) + mylib.VALUE

    def unbox(box):                       # the argument itself is an object of mylib's
        return box.n

    def rank_job():
        import mylib
        return mylib.double(int(os.environ["RANK"]))

    gpulayer.init(**json.loads(sys.argv[1]))
    out = {}
    try:
        out["submit"] = submit.delay(job, 1).get(timeout=90)
        import mylib
        out["arg"] = submit.delay(unbox, mylib.Box(5)).get(timeout=90)
        out["batch"] = submit_batch([submit.s(job, i) for i in range(6)]).get(timeout=90)
        out["set"] = submit.s(job, 2).set(working_dir=".").delay().get(timeout=90)
        out["chain"] = (submit.s(job, 1) | submit.s(job)).apply_async().get(timeout=90)  # sent by the worker
        if len(sys.argv) > 2:
            out["distributed"] = distributed(rank_job, nodes=2, procs_per_node=2).get(timeout=120)
    except JobFailed as err:
        out["error"] = str(err)
    print("RESULT " + json.dumps(out), flush=True)
""")

MISSING = textwrap.dedent("""
    import json, sys
    import gpulayer
    from gpulayer import submit, distributed, JobFailed

    def job():
        import mylib
        return mylib.VALUE

    def unbox(box):
        return box.n

    gpulayer.init(excludes=["mylib.py"])
    import mylib                          # here, beside the script; left out of the archive
    out = {}
    for name, call in (("submit", lambda: submit.delay(job).get(timeout=90)),
                       ("argument", lambda: submit.delay(unbox, mylib.Box(1)).get(timeout=90)),
                       ("distributed", lambda: distributed(job, nodes=1, procs_per_node=1).get(timeout=120))):
        try:
            call()
        except JobFailed as err:
            out[name] = str(err)
    print("RESULT " + json.dumps(out), flush=True)
""")

FIT = textwrap.dedent("""
    import json
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    import gpulayer
    from gpulayer.trainer import Module, Trainer

    class Net(Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            import mylib                  # on every rank, from the shipped code
            x, y = batch
            loss = nn.functional.mse_loss(self.layer(x), y) * (mylib.VALUE / 7)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            g = torch.Generator().manual_seed(3)
            return DataLoader(TensorDataset(torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g)),
                              batch_size=4)

    gpulayer.init()
    trainer = Trainer(num_nodes=2, devices=2, accelerator="cpu", max_epochs=1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(Net())
    print("RESULT " + json.dumps({"steps": trainer.global_step}), flush=True)
""")


@pytest.fixture(scope="module")
def far_fleet(tmp_path_factory):
    """Two workers of two slots, started in a directory of their own (never the project's)."""
    where = tmp_path_factory.mktemp("far-fleet")
    here = os.getcwd()
    os.chdir(where)  # the workers' working directory: nothing of the project is there
    try:
        with running_fleet(where / "fleet", {n: dict(slots=2, zone="eu-1a") for n in ("w-1", "w-2")}) as f:
            os.chdir(here)
            yield f
    finally:
        os.chdir(here)


@pytest.fixture
def project(tmp_path):
    d = tmp_path / "proj"
    d.mkdir()
    (d / "mylib.py").write_text(MYLIB)
    return d


def run_script(fleet, project: Path, text: str, *args: str, path: Path | None = None) -> dict:
    """Run ``text`` as ``project/script.py`` against ``fleet``; ``path``: one more directory on its own sys.path."""
    (project / "script.py").write_text(text)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    here = str(Path(__file__).resolve().parents[1])  # gpulayer itself, never the project
    env.update(GPULAYER_BROKER_URL=fleet.url, GPULAYER_SECRET=fleet.secret,
               PYTHONPATH=os.pathsep.join([here, str(path)] if path else [here]))
    out = subprocess.run([sys.executable, "script.py", *args], cwd=project, env=env, capture_output=True,
                         text=True, timeout=400)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stdout + out.stderr
    return json.loads(lines[-1][len("RESULT "):])


# -- on a fleet ---------------------------------------------------------------------------------------

def test_a_projects_module_reaches_workers_started_elsewhere(far_fleet, project):
    out = run_script(far_fleet, project, JOBS, "{}", "distributed")
    assert out.get("error") is None, out
    assert out["submit"] == 9 and out["arg"] == 5 and out["set"] == 11
    assert out["batch"] == [2 * i + 7 for i in range(6)]
    assert out["distributed"] == [0, 2, 4, 6]
    assert out["chain"] == 2 * 9 + 7  # the next step, sent from the worker, carried the same code


def test_a_changed_module_is_what_the_next_run_imports(far_fleet, project):
    """Each run's pool processes switch to its archive: the old mylib leaves sys.modules with its directory."""
    first = run_script(far_fleet, project, JOBS, "{}")
    (project / "mylib.py").write_text(MYLIB.replace("VALUE = 7", "VALUE = 100"))
    second = run_script(far_fleet, project, JOBS, "{}")
    assert first["submit"] == 9 and second["submit"] == 102, (first, second)
    assert second["batch"] == [2 * i + 100 for i in range(6)]


def test_an_explicit_working_dir_and_py_modules(far_fleet, project, tmp_path):
    lib = tmp_path / "elsewhere"
    lib.mkdir()
    (project / "mylib.py").rename(lib / "mylib.py")
    # mylib is importable here (another directory on this client's path), not in the project: py_modules ships it
    out = run_script(far_fleet, project, JOBS, json.dumps({"working_dir": str(project), "py_modules": ["mylib"]}),
                     path=lib)
    assert out.get("error") is None, out
    assert out["submit"] == 9 and out["batch"] == [2 * i + 7 for i in range(6)]


def test_without_shipping_the_module_is_missing_on_the_workers(far_fleet, project):
    out = run_script(far_fleet, project, JOBS, json.dumps({"working_dir": False}))
    assert "No module named 'mylib' on worker w-" in out["error"], out
    assert "no code was shipped with this job" in out["error"]


def test_a_module_left_out_fails_in_one_line_naming_module_worker_and_fix(far_fleet, project):
    out = run_script(far_fleet, project, MISSING)
    for name in ("submit", "argument", "distributed"):
        text = out[name]
        assert "No module named 'mylib' on worker w-" in text, text
        assert f"it is not in the shipped code (root {project.resolve()})" in text, text
        assert "pass working_dir= or py_modules=, or install it on the workers" in text, text
        assert "\n" not in text


def test_a_cluster_fit_of_two_nodes_by_two_devices_imports_the_projects_module(far_fleet, project):
    out = run_script(far_fleet, project, FIT)
    assert out["steps"] == 2  # 32 samples / (4 ranks x 4)


# -- the archive --------------------------------------------------------------------------------------

def test_the_digest_depends_on_content_only(tmp_path):
    d = tmp_path / "p"
    (d / "pkg").mkdir(parents=True)
    (d / "a.py").write_text("A = 1\n")
    (d / "pkg" / "__init__.py").write_text("")
    first = archive.build(d)
    os.utime(d / "a.py", (1, 1))  # a new mtime, same bytes
    os.chmod(d / "pkg" / "__init__.py", 0o600)
    again = archive.build(d)
    assert (again.digest, again.blob) == (first.digest, first.blob)
    (d / "a.py").write_text("A = 2\n")
    assert archive.build(d).digest != first.digest


def test_excludes_gitignore_and_caches_stay_behind(tmp_path):
    d = tmp_path / "p"
    for sub in ("data", ".git", "__pycache__", "venv", ".hidden", "src", "env2"):
        (d / sub).mkdir(parents=True)
    (d / "env2" / "pyvenv.cfg").write_text("home = /usr\n")
    (d / ".gitignore").write_text("# comment\nsecret.txt\nout/\n")
    (d / "out").mkdir()
    for rel in ("main.py", "conf.yaml", "secret.txt", "out/x.py", "data/big.bin", "model.ckpt", ".git/HEAD",
                "__pycache__/m.cpython-312.pyc", "venv/lib.py", ".hidden/h.py", "src/mod.py", "env2/e.py"):
        (d / rel).write_text("x\n")
    found = archive.build(d, excludes=["data/", "*.ckpt"])
    assert found.files == (".gitignore", "conf.yaml", "main.py", "src/mod.py")
    assert archive.build(d, python_only=True).files == ("main.py",)  # src/ is no package: import would not find it
    (d / "src" / "__init__.py").write_text("")
    assert archive.build(d, python_only=True).files == ("main.py", "src/__init__.py", "src/mod.py")


def test_a_checkout_of_gpulayer_at_the_top_never_travels(tmp_path):
    (tmp_path / "gpulayer").mkdir()
    (tmp_path / "gpulayer" / "__init__.py").write_text("")
    (tmp_path / "sub" / "gpulayer").mkdir(parents=True)
    (tmp_path / "sub" / "gpulayer" / "m.py").write_text("")
    (tmp_path / "main.py").write_text("")
    assert archive.build(tmp_path).files == ("main.py", "sub/gpulayer/m.py")


def test_py_modules_by_name_path_or_module_object(tmp_path, monkeypatch):
    from gpulayer.workspace import shipping

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("X = 1\n")
    (tmp_path / "pkg" / "data.txt").write_text("d\n")
    (tmp_path / "single.py").write_text("Y = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import pkg

    spec = shipping.spec_of(working_dir=False, py_modules=["single", pkg, str(tmp_path / "single.py")])
    found = archive.build(None, py_modules=list(spec.py_modules))
    assert found.files == ("pkg/__init__.py", "pkg/data.txt", "single.py")
    with pytest.raises(Exception, match="py_modules: no module 'nope_not_here'|cannot find module"):
        archive.build(None, py_modules=["nope_not_here"])
    with pytest.raises(TypeError, match="list of module names"):
        shipping.spec_of(py_modules="single")


def test_too_large_a_directory_is_refused_with_the_fix(tmp_path):
    from gpulayer.errors import ConfigError

    for i in range(5):
        (tmp_path / f"m{i}.py").write_text("x = 1\n")
    with pytest.raises(ConfigError, match="limits 3 files.*excludes="):
        archive.build(tmp_path, max_files=3)


def test_rays_runtime_env_spelling_and_its_unsupported_keys(tmp_path):
    from gpulayer.errors import UnsupportedOption
    from gpulayer.workspace import shipping

    spec = shipping.spec_of(runtime_env={"working_dir": str(tmp_path), "excludes": ["data/"]})
    assert spec.working_dir == str(tmp_path.resolve()) and spec.excludes == ("data/",)
    with pytest.raises(UnsupportedOption, match="'pip'.*install packages"):
        shipping.spec_of(runtime_env={"working_dir": ".", "pip": ["requests"]})
    with pytest.raises(Exception, match="is not a directory"):
        shipping.spec_of(working_dir=tmp_path / "nope")


def test_the_default_root_is_never_home_root_nor_an_environment(tmp_path, monkeypatch):
    assert not roots.shippable(Path.home().resolve())
    assert not roots.shippable(Path("/"))
    assert not roots.shippable(Path(sys.prefix) / "bin") or not (Path(sys.prefix) / "pyvenv.cfg").exists()
    assert roots.shippable(tmp_path)
    monkeypatch.setenv("PATH", f"/nowhere{os.pathsep}{tmp_path}")
    assert not roots.shippable(tmp_path)  # where commands live (pytest's, jupyter's entry points): not a project


def test_unpacked_archive_round_trips(tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    (d / "mylib.py").write_text(MYLIB)
    found = archive.build(d, py_modules=[])
    archive.unpack(found.blob, tmp_path / "out")
    assert (tmp_path / "out" / "mylib.py").read_text() == MYLIB
    assert archive.manifest(tmp_path / "out")["root"] == str(d)


# -- a machine's cache (a dictionary stands in for Redis: the unit is the cache's own logic) --------------

class _Redis(dict):
    def get(self, key):
        self.reads = getattr(self, "reads", 0) + 1
        return dict.get(self, key)


@pytest.fixture
def code_cache(tmp_path, monkeypatch):
    from gpulayer import signing
    from gpulayer.workspace import cache

    monkeypatch.setattr(signing, "_secret", b"unit-secret")
    monkeypatch.setattr(cache, "_cluster_root", tmp_path / "root" / "code")
    monkeypatch.setattr(cache, "_ready", {})
    yield cache
    cache._leave()


def _shipped(redis, where: Path, value: int) -> str:
    from gpulayer import signing
    from gpulayer.store import keys

    where.mkdir(parents=True, exist_ok=True)
    (where / "mylib_unit.py").write_text(f"VALUE = {value}\n")
    found = archive.build(where)
    redis[keys.code_archive(found.digest)] = signing.sign(found.blob)
    return found.digest


def test_the_cache_unpacks_once_switches_cleanly_and_sweeps_what_is_idle(code_cache, tmp_path):
    redis = _Redis()
    one, two = _shipped(redis, tmp_path / "v1", 1), _shipped(redis, tmp_path / "v2", 2)
    code_cache.enter(one, lambda: redis)
    import mylib_unit

    assert mylib_unit.VALUE == 1 and redis.reads == 1
    code_cache.enter(one, lambda: pytest.fail("no Redis once the digest is in use"))
    code_cache.enter(two, lambda: redis)  # another project's version: the first one's module is gone
    assert "mylib_unit" not in sys.modules
    import mylib_unit as again

    assert again.VALUE == 2 and redis.reads == 2
    code_cache.enter(None, lambda: redis)  # a job without code sees neither
    assert "mylib_unit" not in sys.modules and not any("code" in p and two in p for p in sys.path)
    base = code_cache.code_root(None)
    os.utime(base / one, (0, 0))  # used a long time ago
    assert code_cache.sweep(base) == [one] and (base / two).is_dir()
    code_cache.enter(one, lambda: redis)  # swept: fetched and unpacked again
    assert redis.reads == 3 and (base / one / "mylib_unit.py").is_file()


def test_an_archive_gone_from_redis_says_to_send_again(code_cache):
    with pytest.raises(code_cache.CodeMissing, match="not in Redis any more.*send the job again"):
        code_cache.enter("0" * 32, lambda: _Redis())
