"""The evaluation layer: SQuAD evaluation (the MACS paper's Tables 2, 4, 5), the haystack test, bf16-vs-float32
agreement, their datasets and metrics, and resumable, data-parallel runs of them."""
