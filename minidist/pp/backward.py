"""A stage's backward in two halves: the input's gradient now (BI), the parameters' later (BW).

    pending = backward_input(output, grad_output, input, params)   # input.grad filled; weights untouched
    ...                                                            # send input.grad, run other work
    backward_weight(pending)                                       # p.grad filled (accumulated)

Why it can be split: in a layer y = x W^T, backward computes dx = dy W (which the previous
stage waits for) and dW = dy^T x (which nobody waits for). Autograd computes both in one node
(the matmul's backward) only because both are asked for; asked for the input alone, it
computes dx and skips dW. So:

  BI   walk the graph once: the nodes on a path from the output to the stage's input are the
       "input path". A parameter hangs off it where an input-path node u has another branch
       leading to the parameter (the matmul node, whose other input is W). Hook u to keep the
       gradient arriving at it (dy), then run backward for the input only: autograd computes
       dx along the input path and skips every branch towards a parameter.
  BW   for each such u: run backward from u again, fed the kept dy, asking for u's own
       parameters only: autograd runs u for its parameter branch (dW = dy^T x) and nothing
       on the input path.

Parameters reached from two input-path nodes (a weight used twice in the stage) get their
gradient in BI, with the input's: resuming from two nodes would run the path between them
twice. Where the stage's input does not require a gradient (the first stage: token ids) there
is no input path and BI does nothing: all of the backward is BW. Gradients accumulate into
p.grad through autograd (torch.autograd.backward(..., inputs=...)), so the hooks of
data-parallel engines fire as in a plain backward. torch.distributed.pipelining splits the
same way (its _backward.py); this is the shortest form of the idea.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge


@dataclass
class PendingWeights:
    """What BW needs from BI: per input-path node, the gradient that reached it and its parameters."""

    resume: list[tuple[Node, list[torch.Tensor]]] = field(default_factory=list)
    grads: dict[Node, tuple] = field(default_factory=dict)
    root: tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor]] | None = None
    """Without an input path: (output, its gradient, every parameter): BW is the whole backward."""


def _graph(root: Node) -> dict[Node, list[Node]]:
    """Every node reachable from `root`, with the nodes its backward feeds (its next functions)."""
    children: dict[Node, list[Node]] = {}
    todo = [root]
    while todo:
        node = todo.pop()
        if node in children:
            continue
        children[node] = [n for n, _ in node.next_functions if n is not None]
        todo += children[node]
    return children


def _reaching(children: dict[Node, list[Node]], targets: set[Node]) -> set[Node]:
    """The nodes from which some node of `targets` can be reached (targets included)."""
    reach: dict[Node, bool] = {}
    for start in children:
        stack = [(start, False)]
        while stack:
            node, expanded = stack.pop()
            if node in reach:
                continue
            if expanded or not children[node]:
                reach[node] = node in targets or any(reach.get(c, False) for c in children[node])
            else:
                stack.append((node, True))
                stack += [(c, False) for c in children[node] if c not in reach]
    return {n for n, r in reach.items() if r}


def _leaves_below(children: dict[Node, list[Node]], on_path: set[Node], leaves: set[Node]) -> dict[Node, frozenset]:
    """For every node off the input path, the parameter nodes (`leaves`) reachable from it (all off the path)."""
    below: dict[Node, frozenset] = {}
    for start in children:
        stack = [(start, False)]
        while stack:
            node, expanded = stack.pop()
            if node in below or node in on_path:
                continue
            kids = [c for c in children[node] if c not in on_path]
            if expanded or not kids:
                below[node] = frozenset({node} & leaves).union(*(below[c] for c in kids))
            else:
                stack.append((node, True))
                stack += [(c, False) for c in kids if c not in below]
    return below


def backward_input(output: torch.Tensor, grad_output: torch.Tensor | None, input: torch.Tensor,
                   params: list[torch.Tensor]) -> PendingWeights:
    """BI: fill input.grad (and the gradients of parameters used twice); return what BW needs."""
    params = [p for p in params if p.requires_grad]
    if output.grad_fn is None or not input.requires_grad:
        return PendingWeights(root=(output, grad_output, params))
    children = _graph(output.grad_fn)
    on_path = _reaching(children, {get_gradient_edge(input).node})
    owner = {get_gradient_edge(p).node: p for p in params}
    below = _leaves_below(children, on_path, set(owner))
    hangs: dict[int, set[Node]] = {}  # parameter -> the input-path nodes it hangs off
    for u in on_path:
        for branch in children[u]:
            for leaf in () if branch in on_path else below[branch]:
                hangs.setdefault(id(owner[leaf]), set()).add(u)
    pending, early = PendingWeights(), []
    by_node: dict[Node, list[torch.Tensor]] = {}
    for p in params:
        nodes = hangs.get(id(p), set())
        if len(nodes) == 1:
            by_node.setdefault(nodes.pop(), []).append(p)
        elif nodes:
            early.append(p)
    handles = [u.register_prehook(_keep(pending.grads, u)) for u in by_node]
    try:
        torch.autograd.backward(output, grad_output, inputs=[input] + early, retain_graph=True)
    finally:
        for h in handles:
            h.remove()
    pending.resume = list(by_node.items())
    return pending


def _keep(store: dict, node: Node):
    def hook(grad_outputs):
        store[node] = grad_outputs
    return hook


def backward_weight(pending: PendingWeights) -> None:
    """BW: accumulate the deferred parameters' gradients into p.grad; `pending` is spent."""
    if pending.root is not None:
        output, grad_output, params = pending.root
        if params:
            torch.autograd.backward(output, grad_output, inputs=params)
    for node, params in pending.resume:
        grads = pending.grads.get(node, ())
        edges = [(GradientEdge(node, k), g) for k, g in enumerate(grads) if g is not None]
        if edges:
            torch.autograd.backward([e for e, _ in edges], [g for _, g in edges], inputs=params)
    pending.resume, pending.grads, pending.root = [], {}, None
