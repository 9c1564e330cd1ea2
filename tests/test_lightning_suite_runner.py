"""The pure parts of scripts/lightning_suite.py: the import rewrite, the private-internals rule, the counting.

The runner's figures guide the Trainer's work, so a silent change in any of these would move them: a rewrite
that misses a spelling measures Lightning instead of gpulayer, a rule that misses a private access counts it
against gpulayer, a tally that drops a case overstates the pass rate.
"""

from __future__ import annotations

import sys
import textwrap
import types
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
sys.path.insert(0, str(SCRIPTS))
sys.path.insert(0, str(SCRIPTS / "lightning_compat" / "sandbox"))

from lightning_compat.private_rule import classify_file  # noqa: E402
from lightning_compat.rewrite import guard_imports, rewrite_names, rewrite_test_source  # noqa: E402
from lightning_compat.runner import FileRun  # noqa: E402
from lightning_compat.tally import cause_kind, function_key, tally_file, totals  # noqa: E402


def test_every_spelling_of_lightning_becomes_gpulayer_trainer():
    source = textwrap.dedent("""\
        import lightning.pytorch as pl
        import lightning as L
        import pytorch_lightning
        from lightning.pytorch import Trainer
        from pytorch_lightning.callbacks import ModelCheckpoint
        from lightning.fabric.utilities.seed import seed_everything
        from lightning_fabric.utilities import rank_zero
        from lightning import LightningModule
        from lightning_utilities.core.imports import RequirementCache
        target = "lightning.pytorch.trainer.trainer.Trainer.fit"
        x = lightning.pytorch.Trainer
        """)
    out = rewrite_names(source)
    assert "import gpulayer.trainer as pl" in out
    assert "import gpulayer.trainer as L" in out
    assert "import gpulayer.trainer\n" in out
    assert "from gpulayer.trainer import Trainer" in out
    assert "from gpulayer.trainer.callbacks import ModelCheckpoint" in out
    assert "from gpulayer.trainer.utilities.seed import seed_everything" in out
    assert "from gpulayer.trainer.utilities import rank_zero" in out
    assert "from gpulayer.trainer import LightningModule" in out
    assert "lightning_utilities.core.imports" in out  # a separate utility package, not Lightning's trainer
    assert '"gpulayer.trainer.trainer.trainer.Trainer.fit"' in out  # mock targets patch ours
    assert "x = gpulayer.trainer.Trainer" in out


def test_guarded_imports_keep_line_numbers_and_bind_every_name():
    source = 'import os\nfrom gpulayer.trainer import (\n    Trainer,\n    seed_everything as se,\n)\nLINE = 6\n'
    out = guard_imports(source)
    assert len(out.splitlines()) == len(source.splitlines())
    assert out.splitlines()[5] == "LINE = 6"
    namespace: dict = {}
    exec(compile(out, "t.py", "exec"), namespace)
    import gpulayer.trainer

    assert namespace["Trainer"] is gpulayer.trainer.Trainer
    assert namespace["se"] is gpulayer.trainer.seed_everything


def test_a_missing_name_fails_only_where_it_is_used():
    out = rewrite_test_source("from lightning.pytorch.utilities.nothing_here import Gizmo\n"
                              "PARAMS = [Gizmo.FIRST, Gizmo.SECOND]\n"  # referred to at import: still collects
                              "class Custom(Gizmo):\n    pass\n"
                              "def test_public():\n    return 1\n"
                              "def test_uses():\n    return Gizmo()\n"
                              "def test_param():\n    return bool(PARAMS[0])\n"
                              "def test_subclass():\n    return Custom()\n")
    module = types.ModuleType("rewritten")
    exec(compile(out, "t.py", "exec"), module.__dict__)  # collection (the import) succeeds
    assert module.test_public() == 1
    for test in (module.test_uses, module.test_param, module.test_subclass):
        with pytest.raises(ImportError, match="cannot import name 'Gizmo'"):
            test()


def test_environment_facts_are_computed_not_imported_from_gpulayer():
    out = rewrite_test_source("from lightning.fabric.utilities.imports import _IS_WINDOWS\n"
                              "from lightning.pytorch.utilities.imports import _TORCH_GREATER_EQUAL_2_1\n")
    namespace: dict = {}
    exec(compile(out, "t.py", "exec"), namespace)
    assert namespace["_IS_WINDOWS"] is (sys.platform == "win32")
    assert namespace["_TORCH_GREATER_EQUAL_2_1"] is True


PRIVATE_FILE = textwrap.dedent('''\
    from unittest import mock
    from lightning.pytorch import Trainer, __version__
    from lightning.pytorch.loops import _FitLoop
    from lightning.fabric.utilities.imports import _IS_WINDOWS
    import pytest


    class PeekingModel:
        def on_train_end(self):
            assert self.trainer._results is not None


    def test_public(tmp_path):
        Trainer().fit(None)
        assert __version__


    @pytest.mark.skipif(_IS_WINDOWS, reason="unix")
    def test_public_with_platform_fact(tmp_path):
        Trainer().fit(None)


    def test_trainer_private(tmp_path):
        assert Trainer()._checkpoint_connector


    def test_loop(tmp_path):
        assert Trainer().fit_loop.max_epochs == 1


    def test_through_helper_class(tmp_path):
        Trainer().fit(PeekingModel())


    @mock.patch("lightning.pytorch.trainer.connectors.data_connector._request_dataloader")
    def test_patches_private(_, tmp_path):
        pass


    def test_private_import():
        assert _FitLoop


    def test_simulated_gpus(cuda_count_2):
        pass


    class TestGroup:
        def test_method_public(self):
            pass

        def test_method_private(self):
            with mock.patch.object(Trainer, "_run"):
                pass
    ''')


def test_private_rule_separates_tests_that_reach_lightning_internals():
    verdicts = classify_file(PRIVATE_FILE)
    public = {k for k, v in verdicts.items() if v is None}
    assert public == {"test_public", "test_public_with_platform_fact", "TestGroup::test_method_public"}
    assert "result collection" in verdicts["test_trainer_private"] or "Trainer" in verdicts["test_trainer_private"]
    assert "loop objects" in verdicts["test_loop"]
    assert "_results" in verdicts["test_through_helper_class"]  # found through the module-level class it uses
    assert "patches" in verdicts["test_patches_private"]
    assert "_FitLoop" in verdicts["test_private_import"]
    assert "simulates accelerators" in verdicts["test_simulated_gpus"]
    assert "private attribute" in verdicts["TestGroup::test_method_private"]


def _run(cases: dict[str, tuple[str, str]], collected=None, errors=()) -> FileRun:
    return FileRun(file="f.py", rc=1, collected=list(collected if collected is not None else cases),
                   collect_errors=list(errors),
                   cases={c: {"outcome": o, "cause": cause} for c, (o, cause) in cases.items()})


def test_function_key_drops_parameters_only():
    assert function_key("test_a[1-x::y]") == "test_a"
    assert function_key("TestC::test_b[p]") == "TestC::test_b"


def test_a_function_passes_when_every_case_lightning_passes_passes_under_gpulayer():
    private = {"test_a": None, "test_b": None, "test_c": None, "test_d": "reaches ...", "test_e": None, "test_f": None}
    light = _run({"test_a[1]": ("passed", ""), "test_a[2]": ("failed", "boom"),
                  "test_b[1]": ("passed", ""), "test_b[2]": ("passed", ""),
                  "test_c": ("skipped", "Requires: [GPUs>=1]"), "test_d": ("passed", ""),
                  "test_e": ("failed", "network"), "test_f[1]": ("passed", ""), "test_f[2]": ("skipped", "MPS")})
    gpu = _run({"test_a[1]": ("passed", ""), "test_a[2]": ("failed", "other"),
                "test_b[1]": ("passed", ""), "test_b[2]": ("failed", "AssertionError: assert 1 == 2"),
                "test_c": ("skipped", "Requires: [GPUs>=1]"), "test_d": ("failed", "x"), "test_e": ("passed", ""),
                "test_f[1]": ("passed", ""), "test_f[2]": ("skipped", "MPS")})
    result = tally_file("f.py", private, light, gpu)
    by_key = {f.key: f for f in result.functions}
    assert not by_key["test_a"].counted  # a case fails under Lightning: the function does not pass there
    assert by_key["test_b"].gpulayer == "failed" and by_key["test_b"].gpulayer_cause.startswith("AssertionError")
    assert not by_key["test_c"].counted and by_key["test_c"].lightning == "skipped"
    assert not by_key["test_d"].counted  # private, whatever its outcome
    assert not by_key["test_e"].counted  # fails under Lightning: not in the denominator
    assert by_key["test_f"].counted and by_key["test_f"].gpulayer == "passed"  # skipped cases do not count
    t = totals([result])
    assert (t["functions"], t["private"], t["skipped"], t["lightning_failed"]) == (6, 1, 1, 2)
    assert (t["counted"], t["passed"], t["percent"]) == (2, 1, 50.0)
    # cases passing under Lightning, public functions: test_a[1], test_b[1], test_b[2], test_f[1]
    assert (t["cases_counted"], t["cases_passed"]) == (4, 3)


def test_a_collection_error_fails_every_function_with_its_cause():
    private = {"test_a": None, "test_b": None}
    light = _run({"test_a": ("passed", ""), "test_b[1]": ("passed", "")})
    gpu = _run({}, collected=[], errors=["ImportError: cannot import name 'X' from 'gpulayer.trainer'"])
    result = tally_file("f.py", private, light, gpu)
    assert [f.gpulayer for f in result.functions] == ["failed", "failed"]
    assert all("cannot import name 'X'" in f.gpulayer_cause for f in result.functions)
    assert totals([result])["passed"] == 0


def test_a_case_lost_to_a_killed_process_counts_as_failed():
    light = _run({"test_a": ("passed", ""), "test_b": ("passed", "")})
    gpu = _run({"test_a": ("passed", "")}, collected=["test_a", "test_b"])
    gpu.note = "the file's pytest process was killed after 10s"
    result = tally_file("f.py", {"test_a": None, "test_b": None}, light, gpu)
    lost = result.functions[1]
    assert lost.gpulayer == "failed" and "killed after 10s" in lost.gpulayer_cause


@pytest.mark.parametrize("cause, kind", [
    ("ImportError: cannot import name 'X'", "missing API"),
    ("AttributeError: 'Trainer' object has no attribute 'state'", "missing API"),
    ("TypeError: __init__() got an unexpected keyword argument 'overfit_batches'", "missing API"),
    ("Failed: DID NOT RAISE <class 'ValueError'>", "no error or warning where Lightning gives one"),
    ("AssertionError: assert 4 == 3", "wrong behaviour (an assertion on results fails)"),
    ("Failed: Timeout (>180.0s) from pytest-timeout.", "hangs"),
])
def test_failure_causes_are_grouped_by_kind(cause, kind):
    assert cause_kind(cause) == kind


def test_a_file_of_private_functions_only_still_renders():
    from lightning_compat.tally import render_markdown, render_text

    result = tally_file("f.py", {"test_a": "reaches ..."}, _run({"test_a": ("passed", "")}), _run({"test_a": ("failed", "x")}))
    assert "0/0" in render_text([result])
    assert "| f.py | 1 | 1 | 0 | 0 | 0 | 0 | - |" in render_markdown([result])


def test_the_markdown_table_shows_earlier_runs_as_columns():
    from lightning_compat.tally import render_markdown

    light = _run({"test_a": ("passed", ""), "test_b": ("passed", "")})
    result = tally_file("f.py", {"test_a": None, "test_b": None}, light, _run({"test_a": ("passed", ""),
                                                                             "test_b": ("failed", "x")}))
    table = render_markdown([result], [("abc1234", {"f.py": {"counted": 2, "passed": 0}})])
    assert "| file | functions | private | skipped | fail under Lightning | counted | passed at abc1234 |" in table
    assert "| f.py | 2 | 0 | 0 | 0 | 2 | 0 | 1 | 50 | 1/2 |" in table
    assert "| **total** | 2 | 0 | 0 | 0 | 2 | 0 | 1 | 50 | 1/2 |" in table


def _tests_tree(root: Path, files: list[str]) -> Path:
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("def test_x():\n    pass\n")
    return root


def test_the_default_run_is_every_test_file_less_the_written_exclusions(tmp_path):
    from lightning_compat.suite_files import EXCLUDED, excluded_present, render_exclusions, whole_suite

    tree = _tests_tree(tmp_path, ["test_cli.py", "callbacks/test_a.py", "trainer/flags/test_b.py",
                                  "accelerators/test_gpu.py", "strategies/test_deepspeed.py", "helpers/datasets.py",
                                  "callbacks/conftest.py"])
    # a new file of the checkout runs; a test file the rule names does not; a helper is no test file
    assert whole_suite(tree) == ["callbacks/test_a.py", "test_cli.py", "trainer/flags/test_b.py"]
    assert set(excluded_present(tree)) == {"accelerators/test_gpu.py", "strategies/test_deepspeed.py"}
    listing = render_exclusions(tree)
    assert "2 files" in listing and "`strategies/test_deepspeed.py`" in listing and "DeepSpeed" in listing
    assert all(why.strip() for why in EXCLUDED.values())


def test_the_named_set_of_issue_26_expands_to_its_files(tmp_path):
    from lightning_compat.suite_files import NAMED_SETS, expand_files

    tree = _tests_tree(tmp_path, ["models/test_hooks.py", "loops/test_a.py", "loops/test_b.py", "models/test_x.py"])
    with pytest.raises(SystemExit, match="matches nothing"):  # the real checkout has every one of them
        expand_files(tree, NAMED_SETS["issue26"])
    assert expand_files(tree, ["models/test_hooks.py", "loops/*.py", "loops/test_a.py"]) == [
        "models/test_hooks.py", "loops/test_a.py", "loops/test_b.py"]


def test_the_markdown_sums_files_by_directory_and_names_the_biggest_gaps():
    from lightning_compat.tally import render_markdown

    light = _run({"test_a": ("passed", ""), "test_b": ("passed", "")})
    half = tally_file("callbacks/test_x.py", {"test_a": None, "test_b": None}, light,
                      _run({"test_a": ("passed", ""), "test_b": ("failed", "AssertionError: assert 1 == 2")}))
    none = tally_file("test_cli.py", {"test_a": None, "test_b": None}, light,
                      _run({"test_a": ("failed", "ImportError: no LightningCLI"),
                            "test_b": ("failed", "ImportError: no LightningCLI")}))
    table = render_markdown([half, none])
    assert "| callbacks | 1 | 2 | 0 | 0 | 0 | 2 | 1 | 50 |" in table
    assert "| . | 1 | 2 | 0 | 0 | 0 | 2 | 0 | 0 |" in table
    assert "| **total** | 2 | 4 | 0 | 0 | 0 | 4 | 1 | 25 |" in table
    gaps = table.split("### Biggest gaps")[1].split("###")[0]
    assert gaps.index("`test_cli.py`: 2 of 2 failing") < gaps.index("`callbacks/test_x.py`: 1 of 2 failing")
    assert "(2 x): ImportError: no LightningCLI" in gaps


def test_first_moves_the_matching_files_ahead_and_keeps_the_rest_in_order():
    import lightning_suite

    files = ["callbacks/test_a.py", "loggers/test_b.py", "test_cli.py", "tuner/test_c.py", "callbacks/x/test_d.py"]
    assert lightning_suite.run_order(files, ["tuner/*", "callbacks/*"]) == [
        "tuner/test_c.py", "callbacks/test_a.py", "callbacks/x/test_d.py", "loggers/test_b.py", "test_cli.py"]
    assert lightning_suite.run_order(files, []) == files


def test_files_sharing_one_process_get_their_own_outcomes_and_collection_errors(tmp_path):
    import shutil

    from lightning_compat.runner import PYTEST_INI, SANDBOX, run_files

    tests = tmp_path / "tests"
    (tests / "tests_pytorch" / "a").mkdir(parents=True)
    (tests / "tests_pytorch" / "a" / "test_one.py").write_text(
        "import pytest\n\n@pytest.mark.parametrize('x', [1, 2])\ndef test_p(x):\n    assert x == 1\n")
    (tests / "tests_pytorch" / "a" / "test_broken.py").write_text("import no_such_module_here\n")
    (tests / "tests_pytorch" / "test_two.py").write_text("def test_q():\n    pass\n")
    shutil.copyfile(SANDBOX / "lsr_plugin.py", tests / "lsr_plugin.py")
    (tests / "pytest.ini").write_text(PYTEST_INI)
    runs = run_files(tests, ["a/test_one.py", "a/test_broken.py", "test_two.py"], python=sys.executable,
                     pythonpath=[], timeout=60, file_timeout=60, k=None)
    one, broken, two = runs["a/test_one.py"], runs["a/test_broken.py"], runs["test_two.py"]
    assert one.collected == ["test_p[1]", "test_p[2]"]
    assert {c: r["outcome"] for c, r in one.cases.items()} == {"test_p[1]": "passed", "test_p[2]": "failed"}
    assert broken.collected == [] and "no_such_module_here" in broken.collect_errors[0]
    assert two.collected == ["test_q"] and two.cases["test_q"]["outcome"] == "passed"  # ran despite the error
    assert not one.collect_errors and not two.collect_errors and not any(r.note for r in runs.values())


def test_a_test_module_another_imports_is_laid_out_beside_it(tmp_path):
    from lightning_compat.runner import build_tree

    src = tmp_path / "src"
    for rel, text in {"__init__.py": "", "conftest.py": "", "helpers/__init__.py": "",
                      "helpers/boring.py": "", "models/__init__.py": "",
                      "models/test_onnx.py": "from tests_pytorch.utilities.test_model_summary import UnorderedModel\n",
                      "utilities/__init__.py": "", "utilities/conftest.py": "",
                      "utilities/test_model_summary.py": "import tests_pytorch.utilities.shapes\n",
                      "utilities/shapes.py": "", "utilities/test_other.py": ""}.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    tests = build_tree("lightning", src, ["models/test_onnx.py"], tmp_path / "out")
    laid = {p.relative_to(tests / "tests_pytorch").as_posix() for p in (tests / "tests_pytorch").rglob("*.py")}
    # the borrowed module and what it borrows in turn, with their packages; not the rest of their directory
    assert {"utilities/__init__.py", "utilities/test_model_summary.py", "utilities/shapes.py"} <= laid
    assert not {"utilities/test_other.py", "utilities/conftest.py"} & laid
