"""Stock CTranslate2 in a worker process, for every call that does not run the loop.

The patched runtime the loop needs is slower than stock ``ctranslate2`` for the encoder and for
greedy ``generate()`` on these CPUs (docs/measurements.md), and the two cannot share a process:
both install the module ``ctranslate2`` and register the same pybind11 types. So a second
process imports stock ``ctranslate2`` from a private directory (``location``; installed by
``scripts/install.sh``, no second virtual environment), loads its own copy of the model and
serves encode, ``generate()``, ``detect_language`` and ``align`` (``worker``), answering over
pipes, with feature and encoder arrays in shared memory (``protocol``). Encoder outputs stay in
the worker; the loop's side copies one only when a call speculates (``client``). Concurrent
``generate()`` calls that can share one run as one call (``batching``: the scheduler), where
the CPU decodes a row the same in a batch as alone (``invariance``: its check).

Modules: ``allocator``, ``batching``, ``client``, ``invariance``, ``location``, ``protocol``,
``worker``.
"""
