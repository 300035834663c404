"""Tokenize once, batch many times: dynamic padding and the global batch order.

Every worker derives the same sequence of *global* batches from the seed and the epoch, then takes
its own equal slice (:func:`local_part`). One worker with batch B and N workers with batch B/N
therefore see exactly the same sentences in the same global batches, which is what makes a
multi-worker step comparable to (and, with dropout off, equal to) a one-worker step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class TokenizedData:
    """Per-field token ids (no padding) and per-example extras; ``collate`` pads a batch.

    The texts are tokenized once, here, before training. The ids of each field are also kept as one flat array
    with offsets, so :meth:`collate` builds a padded batch with a few array operations, not a Python loop over
    its rows (the host prepares a batch in well under a millisecond while the device trains on the last one).
    ``pad_widths`` (set by the loop under ``train.compile``): pad every batch to the smallest of these widths
    that holds its longest row, so a compiled graph is reused across batches.
    """

    def __init__(self, fields: dict[str, list[str]], tokenizer, max_length: int,
                 extras: dict[str, Any] | None = None):
        sizes = {k: len(v) for k, v in fields.items()}
        if len(set(sizes.values())) != 1:
            raise ValueError(f"fields of different lengths: {sizes}")
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.max_length = max_length
        self.ids: dict[str, list[list[int]]] = {
            k: tokenizer(list(texts), truncation=True, max_length=max_length, add_special_tokens=True)["input_ids"]
            for k, texts in fields.items()
        }
        self.extras = {k: np.asarray(v) for k, v in (extras or {}).items()}
        self.n = next(iter(sizes.values()))
        self.pad_widths: tuple[int, ...] | None = None
        self._flat: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for k, seqs in self.ids.items():
            lens = np.fromiter((len(x) for x in seqs), dtype=np.int64, count=len(seqs))
            starts = np.zeros(len(seqs), dtype=np.int64)
            np.cumsum(lens[:-1], out=starts[1:])
            flat = np.fromiter((t for x in seqs for t in x), dtype=np.int64, count=int(lens.sum()))
            self._flat[k] = (flat, starts, lens)

    def __len__(self) -> int:
        return self.n

    def lengths(self, field: str | None = None) -> np.ndarray:
        """Token count of each example (the longest of its fields)."""
        keys = [field] if field else list(self.ids)
        return np.max([self._flat[k][2] for k in keys], axis=0)

    def width(self, longest: int) -> int:
        """The width a batch whose longest row has ``longest`` tokens is padded to."""
        if self.pad_widths is None:
            return longest
        return next((w for w in self.pad_widths if w >= longest), longest)

    def pad(self, seqs: list[list[int]]) -> dict[str, torch.Tensor]:
        width = self.width(max(len(s) for s in seqs))
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
            mask[i, : len(s)] = 1
        return {"input_ids": ids, "attention_mask": mask}

    def _pad_rows(self, field: str, idx: np.ndarray) -> dict[str, torch.Tensor]:
        flat, starts, lens = self._flat[field]
        rows = lens[idx]
        width = self.width(int(rows.max()))
        cols = np.arange(width)
        real = cols[None, :] < rows[:, None]
        at = starts[idx][:, None] + np.minimum(cols[None, :], np.maximum(rows[:, None] - 1, 0))
        ids = np.where(real, flat[np.minimum(at, max(len(flat) - 1, 0))] if len(flat) else 0, self.pad_id)
        return {"input_ids": torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)),
                "attention_mask": torch.from_numpy(real.astype(np.int64))}

    def collate(self, indices) -> dict:
        """{field: {input_ids, attention_mask}} padded to the batch's longest (or to ``pad_widths``), extras as
        tensors, and ``index``: the examples' positions in the data (what a per-sentence cache is keyed by)."""
        idx = np.asarray(indices, dtype=np.int64)
        batch: dict[str, Any] = {k: self._pad_rows(k, idx) for k in self.ids}
        batch["index"] = torch.from_numpy(idx.copy())
        for k, arr in self.extras.items():
            batch[k] = torch.as_tensor(arr[idx])
        return batch


class GlobalBatches:
    """The global batches of each epoch, identical on every worker.

    ``groups`` (optional, one id per example) keeps the members of a group next to each other:
    groups are shuffled, their members concatenated, and the sequence cut into batches (a group
    is split only where a batch ends). ``bucket_lengths`` (optional) sorts examples by length
    inside windows of 100 batches before cutting, so each batch holds sentences of similar length
    (less padding); the batches are then shuffled.
    """

    def __init__(self, n: int, batch_size: int, seed: int, groups: np.ndarray | None = None,
                 bucket_lengths: np.ndarray | None = None, window: int = 100):
        if batch_size > n:
            raise ValueError(f"batch size {batch_size} is larger than the {n} training examples")
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.groups = None if groups is None else np.asarray(groups)
        self.bucket_lengths = None if bucket_lengths is None else np.asarray(bucket_lengths)
        self.window = window

    def __len__(self) -> int:
        return self.n // self.batch_size  # the last partial batch is dropped (it cannot split evenly)

    def epoch(self, epoch: int) -> list[np.ndarray]:
        rng = np.random.default_rng([self.seed, epoch])
        if self.groups is not None:
            uniq = np.unique(self.groups)
            order_groups = rng.permutation(uniq)
            by_group: dict = {}
            for i, g in enumerate(self.groups):
                by_group.setdefault(g, []).append(i)
            order = np.asarray([i for g in order_groups for i in by_group[g]], dtype=np.int64)
        else:
            order = rng.permutation(self.n)
        b = self.batch_size
        usable = len(self) * b
        if self.bucket_lengths is not None and self.groups is None:
            span = b * self.window
            chunks = []
            for start in range(0, usable, span):
                part = order[start: min(start + span, usable)]
                part = part[np.argsort(self.bucket_lengths[part], kind="stable")]
                chunks.append(part)
            order = np.concatenate(chunks) if chunks else order[:0]
            batches = [order[i: i + b] for i in range(0, usable, b)]
            return [batches[i] for i in rng.permutation(len(batches))]
        return [order[i: i + b] for i in range(0, usable, b)]


def local_part(global_batch: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """This worker's equal share of a global batch (contiguous rows rank*b .. (rank+1)*b)."""
    b = len(global_batch) // world_size
    return global_batch[rank * b: (rank + 1) * b]
