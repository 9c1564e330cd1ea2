"""``import gpulayer`` and the command line load only what they use (issue 14, item 6).

``gpulayer/__init__.py`` resolves its public names on first use (PEP 562), so ``gpulayer status``
starts without torch, the Celery app or Celery's worker machinery. Each check runs in a new
interpreter: this test process has imported everything already.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import gpulayer

HEAVY = ("torch", "celery.worker", "celery.app", "kombu", "gpulayer.app", "gpulayer.client", "gpulayer.trainer",
         "lightning")


def _loaded_after(code: str) -> set[str]:
    """The modules a new interpreter holds after running ``code``."""
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


def _heavy(mods: set[str]) -> list[str]:
    return sorted(m for m in mods if any(m == h or m.startswith(h + ".") for h in HEAVY))


@pytest.mark.parametrize("code", ["import gpulayer", "import gpulayer.cli",
                                  "import gpulayer.cli, gpulayer.status; gpulayer.cli.build_parser()",
                                  "from gpulayer import Resources, JobRejected, WorkerInfo"])
def test_the_package_and_the_status_command_import_no_torch_or_celery(code):
    assert _heavy(_loaded_after(code)) == []


def test_every_public_name_imports_and_is_listed():
    names = _loaded_after("from gpulayer import *")
    assert "gpulayer.client" in names and "gpulayer.tasks.submit" in names  # the API loads on use
    for name in gpulayer.__all__:
        assert getattr(gpulayer, name) is not None
    assert set(gpulayer.__all__) <= set(dir(gpulayer))
    from gpulayer import Resources, submit, submit_batch  # noqa: F401
    from gpulayer.models import Resources as defined

    assert Resources is defined
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        gpulayer.nope  # noqa: B018
    with pytest.raises(ImportError):
        from gpulayer import nope  # noqa: F401


def test_a_public_name_used_first_loads_its_module():
    mods = _loaded_after("import gpulayer\nassert gpulayer.submit.name == 'gpulayer.submit'")
    assert {"gpulayer.tasks.submit", "gpulayer.app"} <= mods


def test_the_submit_task_hands_out_job_handles_from_the_client_api():
    """``JobHandle`` lives in the client API (gpulayer/job_handle.py), a layer above the task: reaching
    ``gpulayer.submit`` installs it as the task's handle class."""
    code = ("import gpulayer\nh = gpulayer.submit.AsyncResult('x')\n"
            "assert type(h) is gpulayer.JobHandle and type(h).__module__ == 'gpulayer.job_handle', type(h)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
