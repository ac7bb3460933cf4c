"""Shards of a transcription job: planned by length, written atomically, merged in input order.

A shard is a list of input indices. :func:`plan_shards` balances total audio length over the shards (longest first,
each to the lightest shard), so that workers finish together. :class:`ShardOutputs` keeps one JSON-lines file per
finished shard in a work folder: a shard's file appears (by rename) only once all its records are written, so a job
that died leaves finished shards complete and the others absent; a rerun transcribes the absent ones only.
:meth:`ShardOutputs.check_plan` keeps the plan in the folder, so that a job with other inputs or another shard count
is refused before it starts instead of mixing its shards with the folder's. :meth:`ShardOutputs.merge` puts the
records back in input order and checks that every input is there exactly once.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["INDEX_KEY", "ShardOutputs", "plan_shards"]

#: the input's position, stored with each record of a shard file (dropped by the merge)
INDEX_KEY = "_input_index"


def plan_shards(durations: Sequence[float], num_shards: int) -> list[list[int]]:
    """``num_shards`` lists of input indices whose summed durations are balanced (each list in input order).

    Deterministic: the same durations give the same shards in every process (ties go to the lower index).
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    order = sorted(range(len(durations)), key=lambda i: (-float(durations[i]), i))
    heap = [(0.0, k) for k in range(num_shards)]
    shards: list[list[int]] = [[] for _ in range(num_shards)]
    for i in order:
        load, k = heapq.heappop(heap)
        shards[k].append(i)
        heapq.heappush(heap, (load + float(durations[i]), k))
    return [sorted(shard) for shard in shards]


class ShardOutputs:
    """Finished shards' records under ``folder`` (``shard_00003.jsonl``: shard 3)."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def path(self, shard: int) -> Path:
        return self.folder / f"shard_{shard:05d}.jsonl"

    def _write_atomically(self, final: Path, lines: Iterable[str]) -> None:
        """Lines into a temporary file, then renamed: ``final`` holds all of them or does not exist."""
        temporary = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        with open(temporary, "w", encoding="utf-8") as f:
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, final)

    def check_plan(self, inputs: Sequence[str], shards: Sequence[Sequence[int]]) -> None:
        """Record the plan (the inputs' names and the shards) in the folder, or check it against the one there.

        Raises:
            ValueError: the folder holds another job's plan (other inputs, or another shard count).
        """
        plan = {
            "inputs_sha256": hashlib.sha256("\n".join(inputs).encode("utf-8")).hexdigest(),
            "shards": [list(map(int, shard)) for shard in shards],
        }
        path = self.folder / "plan.json"
        if path.is_file():
            with open(path, encoding="utf-8") as f:
                theirs = json.load(f)
            if theirs != plan:
                planned = len(theirs.get("shards", []))
                if theirs.get("inputs_sha256") != plan["inputs_sha256"]:
                    other = "other inputs"
                elif planned != len(shards):
                    other = f"{planned} shards; this job plans {len(shards)}"
                else:
                    other = "other input durations"
                raise ValueError(
                    f"work_dir {str(self.folder)!r} holds the shards of another job ({other}): "
                    "use another work_dir, or delete it to start over"
                )
            return
        self._write_atomically(path, [json.dumps(plan) + "\n"])  # every rank writes the same plan

    def done(self, shard: int) -> bool:
        """Whether the shard's output is complete (a partial write is never under this name)."""
        return self.path(shard).is_file()

    def write(self, shard: int, indices: Sequence[int], records: Sequence[dict[str, Any]]) -> Path:
        """Write the shard's records (``records[j]`` is input ``indices[j]``'s) atomically: temp file, then rename."""
        if len(indices) != len(records):
            raise ValueError(f"shard {shard}: {len(records)} records for {len(indices)} inputs")
        final = self.path(shard)
        self._write_atomically(
            final,
            (json.dumps({**record, INDEX_KEY: int(index)}, ensure_ascii=False) + "\n"
             for index, record in zip(indices, records, strict=True)),
        )  # fmt: skip
        return final

    def merge(self, shards: Sequence[Sequence[int]]) -> list[dict[str, Any]]:
        """Every input's record, in input order, from the files of ``shards`` (the plan they were written for).

        Raises:
            FileNotFoundError: a shard is not finished (naming it).
            ValueError: a shard file holds other inputs than its plan says (a plan changed between runs).
        """
        total = sum(len(shard) for shard in shards)
        merged: list[dict[str, Any] | None] = [None] * total
        for k, planned in enumerate(shards):
            if not planned:  # more shards than inputs: nothing to read
                continue
            if not self.done(k):
                raise FileNotFoundError(f"shard {k} ({len(planned)} inputs) has no output in {self.folder}; rerun")
            with open(self.path(k), encoding="utf-8") as f:
                records = [json.loads(line) for line in f if line.strip()]
            found = [record.pop(INDEX_KEY) for record in records]
            if found != list(planned):
                raise ValueError(
                    f"{self.path(k)} holds inputs {found[:5]}... but the plan gives this shard {list(planned)[:5]}...: "
                    "the inputs or the shard count changed since it was written; use another work folder"
                )
            for index, record in zip(found, records, strict=True):
                merged[index] = record
        return merged  # type: ignore[return-value]  # every slot filled: the shards partition the inputs
