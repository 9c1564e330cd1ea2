"""Small modules written the way Lightning users write them, run under both Trainers by
``tests/trainer/test_examples_match_lightning.py``.

Each file imports only ``gpulayer.trainer`` (as ``L``) and its submodules; the test swaps
``gpulayer.trainer`` for ``lightning.pytorch`` in the source text to get Lightning's version.
Each has ``fit(root, **trainer_kwargs) -> (model, trainer, data)`` (seed, build, fit) and
``evaluate(model, trainer, data) -> (tested, predicted)`` (test and predict from the best
checkpoint), the two halves of a user's script.
"""
