"""The assembly: the floor on top, where the rooms below become one run.

- `plan`: every check of a request before anything is built or written, and
  the decisions made once (devices, strategy, global batch);
- `run`: builds the run a `Plan` describes (checkpoints, actions, controller)
  and runs its mode: train, evaluate, continuous evaluation, export;
- `serving`: the exported SavedModel's signatures.

Users reach it through the public face (`from tfloop.engine import run`).
"""
