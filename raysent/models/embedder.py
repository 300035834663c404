"""Turn a list of sentences into vectors: each distinct sentence once, in length-sorted batches."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch


class Embedder:
    """``Embedder(embed_fn, tokenizer)(sentences) -> np.ndarray [N, d]`` (float32, input order).

    ``embed_fn(tok) -> Tensor [b, d]`` embeds one tokenized batch (``{input_ids, attention_mask}``).
    Sentences are deduplicated, sorted by token length (little padding) and embedded without
    gradients; the module owning ``embed_fn`` is switched to eval mode for the call and back after.
    """

    def __init__(self, embed_fn: Callable[[dict], torch.Tensor], tokenizer, module: torch.nn.Module | None = None,
                 max_length: int = 256, batch_size: int = 128, device: torch.device | str = "cpu"):
        self.embed_fn = embed_fn
        self.tokenizer = tokenizer
        self.module = module
        self.max_length = max_length
        self.batch_size = batch_size
        self.device = torch.device(device)

    def __call__(self, sentences: Sequence[str]) -> np.ndarray:
        uniq = list(dict.fromkeys(sentences))
        index = {s: i for i, s in enumerate(uniq)}
        ids = self.tokenizer(uniq, truncation=True, max_length=self.max_length, add_special_tokens=True)["input_ids"]
        order = np.argsort([len(x) for x in ids], kind="stable")
        out: np.ndarray | None = None
        was_training = self.module.training if self.module is not None else False
        if self.module is not None:
            self.module.eval()
        try:
            with torch.inference_mode():
                for start in range(0, len(order), self.batch_size):
                    chunk = order[start: start + self.batch_size]
                    seqs = [ids[i] for i in chunk]
                    width = max(len(s) for s in seqs)
                    pad_id = self.tokenizer.pad_token_id or 0
                    input_ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
                    mask = torch.zeros((len(seqs), width), dtype=torch.long)
                    for j, s in enumerate(seqs):
                        input_ids[j, : len(s)] = torch.as_tensor(s)
                        mask[j, : len(s)] = 1
                    vec = self.embed_fn({"input_ids": input_ids.to(self.device),
                                         "attention_mask": mask.to(self.device)}).float().cpu().numpy()
                    if out is None:
                        out = np.empty((len(uniq), vec.shape[1]), dtype=np.float32)
                    out[chunk] = vec
        finally:
            if self.module is not None and was_training:
                self.module.train()
        assert out is not None
        return out[[index[s] for s in sentences]]
