"""Validation: the model checked against measurements. Whole-step predictions written before a measurement
run, predicted-vs-measured tables after it, the training glue fit and the reports built from them.

It sits beside the top of the layer table with `calibration/` (which measures on a GPU): it reads the
measurement harness's specs and run directories and calls the step model, and no model package imports
it, so a model never depends on how it was checked. Its entry points are `k3sim check ...`
(`k3sim/commands/check.py`), under the CLI contract.

- `decode_step`: serving whole steps (CUDA-graph decode, eager mixed prefill) on one GPU;
- `train_step`: training forward / forward+backward of layer slices on one GPU;
- `glue_fit`: the training glue factors fitted on profiled training points (`step/glue.py` reads them);
- `train_report`: `reports/training/README.md` and its figure from the committed training runs.
"""
