"""What the stock engine's worker costs in memory: its resident size with the model loaded, and
after encoding one 30 s window, per model and compute type.

    python bench/stock_worker_memory.py --out bench/results/stock_worker/memory.json
"""

from __future__ import annotations

import argparse

import numpy as np

from _common import write_result

from ct2_flash import resolve_model
from ct2_flash.engine.models import available_models
from ct2_flash.runtime.vocabulary import load_config
from ct2_flash.stock.client import StockEngine


def resident_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="utf-8") as status:
        line = next(line for line in status if line.startswith("VmRSS"))
    return int(line.split()[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = []
    for name in [model for model in ("tiny.en", "base") if model in available_models()]:
        path = resolve_model(name)
        mels = int(load_config(path).get("num_mel_bins", 80))
        for compute_type in ("float32", "int8_float32"):
            engine = StockEngine(path, compute_type, 2)
            try:
                encoding = engine.encode(np.zeros((1, mels, 3000), dtype=np.float32))
                loaded_and_encoded = resident_mb(engine._process.pid)  # noqa: SLF001
            finally:
                engine.close()
            engine = StockEngine(path, compute_type, 2)
            try:
                engine._ensure_started()  # noqa: SLF001  (loaded, nothing asked yet)
                loaded = resident_mb(engine._process.pid)  # noqa: SLF001
            finally:
                engine.close()
            del encoding
            rows.append({"model": name, "compute_type": compute_type, "loaded_mb": round(loaded),
                         "after_one_encode_mb": round(loaded_and_encoded)})
            print(rows[-1], flush=True)
    write_result(args.out, {"what": "resident memory of the stock engine's worker process (VmRSS)", "rows": rows})


if __name__ == "__main__":
    main()
