"""The assembly: the floor on top, where the rooms below become one run.

- `plan`: every check of a request before anything is built or written, and
  the decisions made once (devices, strategy, global batch);
- `parts`: what every mode runs with (model, objectives, moving average,
  evaluator), built once under the strategy's scope;
- `runner`: `Runner`, every mode (the evaluator task's too) built by the
  same steps (`build_checkpointing`, `build_clock`, `build_actions`,
  `build_controller`) and run by `run_mode`, as Model Garden's
  `OrbitExperimentRunner`;
- `run`: the public functions, thin: `run(config)` (plan, strategy, lock,
  parts, runner) and `export_checkpoint`;
- `serving`: the exported SavedModel's signatures.

`keras_fit` stands above this floor (it calls `run`); nothing here imports
it. docs/engine.md describes the assembly on one page.

Users reach it through the public face (`tfloop.run`, also `from tfloop.engine import run`).
"""
