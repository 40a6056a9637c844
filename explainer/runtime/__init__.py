"""The runtime layer: where work runs and what it may spend.

Devices and the one way tensors leave them (`host`), the precision a model runs in, memory checks and batch sizes
(`memory`, `kv`), which models fit this machine (`fit`), the hardware facts read once (`hardware`), CPU threads, and
one request at a time per model with cancellation (`session`). Nothing here knows about attribution methods.
"""
