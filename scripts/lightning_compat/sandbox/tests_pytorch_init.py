"""tests_pytorch/__init__.py of the gpulayer side's temporary tree: the paths Lightning's tests import."""

from pathlib import Path

_TEST_ROOT = Path(__file__).parent.parent
_PROJECT_ROOT = _TEST_ROOT.parent
_PATH_DATASETS = _PROJECT_ROOT / "Datasets"
_PATH_LEGACY = _TEST_ROOT / "legacy"
