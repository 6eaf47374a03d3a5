"""Time opening a GGUF with gguf's own reader against the project's (floor/gguf_reader.py).

Interleaved: each repeat opens the file once with each reader, in alternating order, and checks
that both read the same fields and tensors. The default file is the vendored Qwen2 vocabulary
(151,936 tokens and 151,387 merges), whose metadata is what the JSON planner's files carry.

    python bench/gguf_read.py --repeats 3 --out docs/bench/gguf_read.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import gguf
from benchio import emit_result

from robot_latency.floor.gguf_reader import GGUFReader
from robot_latency.hostcheck.load import LoadWatch
from robot_latency.profiles.vocab import vocab_path


def _open_s(reader: type[gguf.GGUFReader], path: Path) -> tuple[float, gguf.GGUFReader]:
    t0 = time.perf_counter()
    r = reader(str(path))
    return time.perf_counter() - t0, r


def _same(a: gguf.GGUFReader, b: gguf.GGUFReader) -> bool:
    if list(a.fields) != list(b.fields) or len(a.tensors) != len(b.tensors):
        return False
    fields = all(x.types == y.types and x.data == y.data and x.contents() == y.contents()
                 for x, y in zip(a.fields.values(), b.fields.values(), strict=True))
    tensors = all((s.name, s.n_bytes, s.data_offset) == (t.name, t.n_bytes, t.data_offset)
                  for s, t in zip(a.tensors, b.tensors, strict=True))
    return fields and tensors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--file", default=None, help="GGUF to open (default: the Qwen2 vocabulary)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    path = Path(args.file) if args.file else vocab_path("qwen2")
    watch = LoadWatch().start()
    runs: list[dict[str, Any]] = []
    for i in range(args.repeats):
        order = [("gguf", gguf.GGUFReader), ("project", GGUFReader)]
        if i % 2:
            order.reverse()
        seconds, readers = {}, {}
        for name, cls in order:
            seconds[name], readers[name] = _open_s(cls, path)
        runs.append({"order": [n for n, _ in order], "gguf_s": round(seconds["gguf"], 3),
                     "project_s": round(seconds["project"], 3),
                     "same": _same(readers["gguf"], readers["project"])})
    load = watch.stop()
    med = {k: statistics.median(r[k] for r in runs) for k in ("gguf_s", "project_s")}
    return emit_result({
        "file": str(path), "bytes": path.stat().st_size, "n": len(runs), "runs": runs,
        "median_s": med, "ratio_gguf_over_project": round(med["gguf_s"] / med["project_s"], 1),
        "all_same": all(r["same"] for r in runs), "host_load": load.to_dict(),
    }, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
