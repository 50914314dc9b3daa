"""From "a gradient was accumulated" to "its bucket's collective is in flight", in bucket order.

The path one gradient takes, the same for DDP's all_reduce and ZeRO's reduce_scatter:

    hook fires       autograd accumulated p.grad and runs p's post-accumulate-grad hook
                     (hook_gradients, below) -> the engine's on-gradient method
    bucket fills     the engine puts the gradient into its bucket and counts it down
    launch           when a bucket is full, OrderedLauncher.launch_ready() starts the
                     collective of every full bucket from the next one in order, and
                     stops at the first that is still filling; backward keeps running
    callback waits   the first hook of a backward queued the engine's end-of-backward
                     callback (queue_end_of_backward); the autograd engine runs it once
                     every gradient is computed: it completes the buckets no gradient
                     reached, launches them, and waits on every collective in order

Why strictly in bucket order: gloo and NCCL match collectives by the order in which each
rank issues them. If rank 0 launched bucket 2 before bucket 1 and rank 1 the other way
round, they would sum different buckets. A bucket that fills early waits (FULL) until
every earlier one has launched.

Why a callback at the end of backward, not a wait in step(): backward() then returns with
the gradients averaged, as torch's DDP promises, and the engine is back in one state
whatever the optimizer does next.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Generic, Sequence, TypeVar

import torch

B = TypeVar("B")

REDUCED_MARK = "_minidist_ddp_reduced"
"""Set on the parameters DDP reduces (mark_reduced): minidist.zero.ShardedOptimizer, which reduces its own
gradients, refuses them (their gradients would be sent twice)."""


def mark_reduced(params: Sequence[torch.Tensor]) -> None:
    """Say on each parameter that a replicating engine (DDP) averages its gradient."""
    for p in params:
        setattr(p, REDUCED_MARK, True)


def is_reduced(param: torch.Tensor) -> bool:
    """Whether mark_reduced() was called on `param`."""
    return getattr(param, REDUCED_MARK, False)


def hook_gradients(owner: Any, params: Sequence[torch.Tensor], keys: Sequence[Any],
                   on_gradient: Callable[[Any, Any, torch.Tensor], None]) -> list:
    """Hook each parameter: once autograd has accumulated its .grad, on_gradient(owner, key, param) runs.

    The hooks hold `owner` weakly: a discarded engine is freed, its hooks then do nothing.
    Returns the handles (remove() them when the engine rebuilds its buckets).
    """
    ref = weakref.ref(owner)

    def make(key):
        def hook(param: torch.Tensor) -> None:
            engine = ref()
            if engine is not None:
                on_gradient(engine, key, param)
        return hook

    return [p.register_post_accumulate_grad_hook(make(k)) for p, k in zip(params, keys)]


def queue_end_of_backward(callback: Callable[[], None]) -> None:
    """Run `callback` when the autograd engine finishes the backward now running (after every hook).

    Call it from a hook of that backward (the first one, once per backward).
    """
    torch.autograd.Variable._execution_engine.queue_callback(callback)


class OrderedLauncher(Generic[B]):
    """Launches `buckets` strictly in order, each as soon as it and every earlier one is full.

    is_full(bucket) says whether a bucket may launch; launch(bucket) starts its collective.
    """

    def __init__(self, is_full: Callable[[B], bool], launch: Callable[[B], None]):
        self.buckets: list[B] = []
        self._is_full, self._launch = is_full, launch
        self.next = 0
        """Index of the first bucket not launched in this backward."""

    def launch_ready(self) -> None:
        """Launch every full bucket from the next one in order; stop at the first that is not."""
        while self.next < len(self.buckets) and self._is_full(self.buckets[self.next]):
            self._launch(self.buckets[self.next])
            self.next += 1

    @property
    def unlaunched(self) -> list[B]:
        """The buckets not launched yet in this backward, in order (the end of backward completes them)."""
        return self.buckets[self.next:]

    def reset(self) -> None:
        """A new backward: launching starts again from bucket 0."""
        self.next = 0
