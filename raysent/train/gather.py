"""Negatives from every worker: an all-gather that lets the gradient flow back to each worker.

Each worker computes the loss of its own rows against the columns of the *global* batch. The
columns come from :class:`AllGatherWithGrad`: forward concatenates every worker's tensor (rank
order); backward sums the incoming gradient over the workers (an all-reduce) and keeps this
worker's slice — the gradient of the *sum* of all workers' losses with respect to this worker's
embeddings (as open_clip's ``gather_features(gather_with_grad=True)`` and SimCLR's ``GatherLayer``).
DDP then averages the parameter gradients over the W workers, so one step on W workers equals one
step of one worker on the whole global batch whose loss is the mean over all rows: each worker's
loss is the mean over its b rows, and (1/W)·Σ_w mean_w = mean over the W·b rows.

SimCSE's own trick (put the worker's tensor with grad back into a no-grad gather) drops the
gradient of the other workers' losses through this worker's embeddings; it is not equal to the
one-worker step, so it is not used here. All-reduce (not reduce-scatter) keeps it working on
gloo. Under bf16 autocast (``train.precision``) the embeddings are gathered in the dtype they come
in, bf16 or float32: gloo, like NCCL, all-gathers and all-reduces bf16 (2 workers in bf16 against one
in fp32: tests/train/test_ray_train.py). Torch only; no Ray.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from raysent.methods.base import Gatherer


class AllGatherWithGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.rank, ctx.world, ctx.rows = dist.get_rank(), dist.get_world_size(), x.shape[0]
        parts = [torch.empty_like(x) for _ in range(ctx.world)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad[ctx.rank * ctx.rows:(ctx.rank + 1) * ctx.rows]


class DistributedGatherer(Gatherer):
    """Global negatives: ``g(x)`` gathers with gradient, ``g.gather_nograd(x)`` gathers labels/ids."""

    def __init__(self) -> None:
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return AllGatherWithGrad.apply(x)

    def gather_nograd(self, x: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=0)
