"""The evaluation layer: SQuAD evaluation (the MACS paper's Tables 2, 4, 5), the haystack test, bf16-vs-float32
agreement, the calibration forms of MACS judged on held-out rows (`forms`), their datasets and metrics, and resumable,
data-parallel runs of them. The removal and pi-Soft metrics live with their protocols in `explainer/faithfulness/`."""
