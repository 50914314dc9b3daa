"""Activation memory of minidist's GPT: what one training forward leaves alive for backward, by formula.

    acts = activation_bytes(GPTShape.of(cfg, batch=8), RunPrecision("bf16"), Parallelism(tp=2, sequence_parallel=True))
    acts.total, acts.per_layer, acts.ledger()           # bytes per rank

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", section 4,
equation 1 and Table 2) count a layer's stored activations as s b h (34 + 5 a s / h) bytes at 2-byte
activations and 1-byte dropout masks (s sequence, b batch, h width, a heads): 11 s b h + 5 a s^2 b for
attention (the s^2 terms: the softmax, its dropout mask and output), 19 s b h for the MLP, 4 s b h for
the two norms. With t-way tensor parallelism s b h (10 + 24/t + 5 a s/(h t)); with sequence parallelism
s b h (34 + 5 a s/h) / t; full recompute keeps 2 s b h (the layer's input); selective recompute drops
the 5 a s^2 b.

minidist's GPT (minidist/models/gpt.py) keeps, per layer, in the compute dtype (e bytes):

    ln_1 input            s b h       (residual stream)     qkv input (ln_1 output)   s b h
    q, k, v (qkv output)  3 s b h / t                        attention output = proj input  s b h / t
    ln_2 input            s b h                              fc input (ln_2 output)    s b h
    GELU input            4 s b h / t                        MLP proj input            4 s b h / t
    norm statistics       4 s b       (mean, rstd)           attention logsumexp       4 a s b / t bytes (fp32)

16 s b h elements: the paper's 32 s b h bytes of data exactly (its 34 less 2 of dropout masks) when
dropout is 0 (the config's default), where F.scaled_dot_product_attention takes its flash kernel
(on the CPU, _scaled_dot_product_flash_attention_for_cpu), which keeps q, k, v, its output and a
logsumexp, no s^2 term: what the paper's selective recompute keeps, without recomputing. Unlike the
paper's block there is no dropout after the attention projection, and the output projection reads
the attention output in place (flash's layout makes the transpose free). With dropout > 0 (training)
the CPU takes the math kernel instead, in fp32 whatever the compute dtype: q and k scaled, v made
contiguous (3 s b h x 4 bytes), the softmax, the dropout's float mask and its output (3 a s^2 b x 4
bytes: 12 where the paper has 5), the projection's input a copy of its own (s b h x e); each
nn.Dropout keeps a float mask (s b h x e on the CPU; CUDA's fused dropout a 1-byte one).

Tensor parallelism (minidist.tp, Megatron's layout) splits what lies between the column- and row-
parallel linears by t: 4 + 12/t elements. Sequence parallelism splits the norms' inputs and
statistics by t too, but minidist's column-parallel linears keep the all-gathered input whole
(minidist/tp/linear.py: one all_gather less per layer than Megatron, which keeps the chunk and
gathers again in backward): 2 + 14/t, where the paper has 34/t bytes (17/t elements). Full recompute
(activation_checkpointing: torch.utils.checkpoint per block) keeps the block's input and the CPU
generator's state (5056 bytes: checkpoint's preserve_rng_state), and recomputes one block at a time
in backward (`recompute_transient`).

Precision (minidist.precision.RunPrecision): fp32 keeps everything in 4 bytes; bf16 and fp16 in 2
where the engine computes with bf16 copies of the parameters (every minidist engine under
trainer.precision, compute_params=True). Under torch.autocast over fp32 parameters (a plain model:
compute_params=False) the residual stream, the norms' inputs and statistics stay fp32, and autocast
caches a 2-byte copy of every matmul weight until the forward ends (`autocast_copies`; not those of a
checkpointed block). The loss
is computed in fp32 either way (the log-softmax, b s V x 4; vocabulary-parallel: b s V / t x 4).

Around the layers: the positions (s int64), the final norm (as ln_1), the head's input (s b h, whole
under TP and SP alike), the logits (b s V x e, / t vocabulary-parallel) the forward returns, the
loss. Pipeline (pp) and context (cp) parallelism: _staged(), by formula until the trainer runs them.
Checked against torch's profiler allocation events at small scale: tests/memory/test_activations.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from minidist.precision import RunPrecision

RNG_STATE_BYTES = 5056
"""torch.get_rng_state(): the CPU generator's state, which torch.utils.checkpoint saves per call."""


@dataclass(frozen=True)
class GPTShape:
    """One rank's forward: its micro-batch and the model's shape (minidist.models.gpt.GPTConfig)."""

    batch: int
    seq: int
    hidden: int
    heads: int
    layers: int
    vocab: int
    dropout: float = 0.0

    @classmethod
    def of(cls, cfg, batch: int, seq: int | None = None) -> "GPTShape":
        """From a GPTConfig (or the config group with its fields); seq defaults to block_size."""
        return cls(batch, seq or cfg.block_size, cfg.n_embd, cfg.n_head, cfg.n_layer, cfg.vocab_size, cfg.dropout)


@dataclass(frozen=True)
class Parallelism:
    """How the forward is split and what it recomputes (recompute: none, full, selective)."""

    tp: int = 1
    sequence_parallel: bool = False
    vocab_parallel: bool = False
    recompute: str = "none"
    pp: int = 1
    cp: int = 1


@dataclass(frozen=True)
class Activations:
    """Bytes per rank that a training forward leaves alive (the module docstring's terms)."""

    per_layer: float
    layers: int
    embedding: float
    head: float
    loss: float
    autocast_copies: float
    recompute_transient: float
    """Full recompute: one block's activations, rebuilt inside backward (0 otherwise)."""
    items: tuple[tuple[str, float], ...]
    """The per-layer ledger: (what, bytes)."""

    @property
    def total(self) -> float:
        """Alive when the forward returns (logits and loss included)."""
        return self.per_layer * self.layers + self.embedding + self.head + self.loss + self.autocast_copies

    def ledger(self) -> str:
        lines = [f"  {what:<34}{b / 2**20:>10.3f} MiB" for what, b in self.items]
        return "\n".join([f"per layer ({self.layers} layers): {self.per_layer / 2**20:.3f} MiB", *lines])


def activation_bytes(shape: GPTShape, precision: RunPrecision | str = "fp32", par: Parallelism = Parallelism(), *,
                     device: str = "cpu", compute_params: bool = True) -> Activations:
    """The module docstring's formulas for one rank of a training forward; `device`: which attention kernel runs."""
    precision = RunPrecision(precision) if isinstance(precision, str) else precision
    if par.pp > 1 or par.cp > 1:
        return _staged(shape, precision, par, device, compute_params)
    if par.recompute not in ("none", "full", "selective"):
        raise ValueError(f"recompute must be none, full or selective, got {par.recompute!r}")
    e = precision.compute_bytes
    r = e if compute_params else 4  # the residual stream, norms' inputs and statistics
    items = _layer(shape, par, e, r, device)
    full = sum(b for _, b in items)
    t, sp = par.tp, par.sequence_parallel
    sbh = shape.seq * shape.batch * shape.hidden
    if par.recompute == "full":
        stored = (("block input", sbh / (t if sp else 1) * r), ("generator state", RNG_STATE_BYTES))
        per_layer, transient, items = sum(b for _, b in stored), full, stored
    else:
        per_layer, transient = full, 0.0
    return Activations(per_layer, shape.layers, _embedding(shape, par, r), _head(shape, par, e, r), _loss(shape, par),
                       0.0 if compute_params else _autocast_copies(shape, par), transient, tuple(items))


def _staged(shape: GPTShape, precision: RunPrecision, par: Parallelism, device: str, compute_params: bool) -> Activations:
    """Pipeline and context parallelism, by formula (not yet checked against the profiler: the trainer runs
    neither). cp: every rank keeps its s / cp tokens of each tensor (ring attention keeps its own q, k, v,
    output and logsumexp; the blocks it receives are transient). pp under 1F1B: the first stage holds
    min(m, p) = p micro-batches of its L / p layers (L layers' worth of one micro-batch) and the embedding;
    the last stage one micro-batch of its layers, the head and the loss: the larger of the two."""
    if shape.seq % par.cp or shape.layers % par.pp:
        raise ValueError(f"cp {par.cp} must divide the sequence {shape.seq} and pp {par.pp} the layers {shape.layers}")
    local = dataclasses.replace(shape, seq=shape.seq // par.cp, layers=shape.layers // par.pp)
    one = activation_bytes(local, precision, dataclasses.replace(par, pp=1, cp=1), device=device,
                           compute_params=compute_params)
    first = dataclasses.replace(one, layers=local.layers * par.pp, head=0.0, loss=0.0)
    if par.pp == 1:
        return one
    return max(first, dataclasses.replace(one, embedding=0.0), key=lambda a: a.total)


def _autocast_copies(shape: GPTShape, par: Parallelism) -> float:
    """Autocast's cached 2-byte copies of the matmul weights: 12 h^2 / t per layer (none inside a checkpointed
    block: it recomputes), and the tied head's V h (/ t vocabulary-parallel)."""
    h = shape.hidden
    layers = 0 if par.recompute == "full" else 12 * h * h * shape.layers / par.tp
    return 2 * (layers + shape.vocab * h / (par.tp if par.vocab_parallel else 1))


def _layer(shape: GPTShape, par: Parallelism, e: int, r: int, device: str) -> list[tuple[str, float]]:
    """(what, bytes) of one block's saved tensors (module docstring)."""
    s, b, h, a, t = shape.seq, shape.batch, shape.hidden, shape.heads, par.tp
    sbh = s * b * h
    split = t if par.sequence_parallel else 1  # what lies between TP regions
    math_attention = shape.dropout > 0 and device == "cpu" and par.recompute != "selective"
    items = [("ln_1, ln_2 inputs", 2 * sbh / split * r), ("norm statistics", 4 * s * b / split * r),
             ("qkv, fc inputs (whole)", 2 * sbh * e)]
    if math_attention:
        items += [("q, k scaled, v (fp32)", 3 * sbh / t * 4), ("softmax, mask, dropout (fp32)", 3 * a * s * s * b / t * 4),
                  ("proj input", sbh / t * e)]
    else:
        items += [("q, k, v", 3 * sbh / t * e), ("attention output", sbh / t * e),
                  ("logsumexp (fp32)", a * s * b / t * 4)]
    items += [("GELU input, MLP proj input", 8 * sbh / t * e)]
    if shape.dropout > 0:
        items += [("MLP dropout mask", sbh / split * (e if device == "cpu" else 1))]
    return items


def _embedding(shape: GPTShape, par: Parallelism, r: int) -> float:
    """Positions (int64), the vocabulary-parallel lookup's index and mask, the embedding dropout's mask."""
    out = shape.seq * 8
    if par.vocab_parallel and par.tp > 1:
        out += shape.batch * shape.seq * 9  # the shifted int64 index the lookup saves, and its bool mask
    if shape.dropout > 0:
        out += shape.seq * shape.batch * shape.hidden / (par.tp if par.sequence_parallel else 1) * r
    return out


def _head(shape: GPTShape, par: Parallelism, e: int, r: int) -> float:
    """The final norm's input and statistics, the head's (whole) input, the logits."""
    split = par.tp if par.sequence_parallel else 1
    sbh, bs = shape.seq * shape.batch * shape.hidden, shape.seq * shape.batch
    vocab = shape.vocab / (par.tp if par.vocab_parallel else 1)
    return sbh / split * r + 2 * bs / split * r + sbh * e + bs * vocab * e


def _loss(shape: GPTShape, par: Parallelism) -> float:
    """fp32 log-softmax (nn.CrossEntropyLoss) or softmax (vocabulary-parallel), and the small tensors beside."""
    bs = shape.seq * shape.batch
    if par.vocab_parallel and par.tp > 1:
        return bs * shape.vocab / par.tp * 4 + bs * 9 + 4  # softmax, target index and mask, the mean
    return bs * shape.vocab * 4 + 4 + 4  # log-softmax, nll_loss's total weight, the loss


def korthikanti(shape: GPTShape, par: Parallelism = Parallelism()) -> float:
    """The paper's bytes per layer (Table 2; 2-byte activations), for comparison with minidist's own."""
    s, b, h, a, t = shape.seq, shape.batch, shape.hidden, shape.heads, par.tp
    if par.recompute == "full":
        return 2 * s * b * h
    quad = 0.0 if par.recompute == "selective" else 5 * a * s / h
    if par.sequence_parallel:
        return s * b * h * (34 + quad) / t
    return s * b * h * (10 + 24 / t + quad / t)


GPT_7B = GPTShape(batch=4, seq=2048, hidden=4096, heads=32, layers=36, vocab=50304)
"""A 7.5B GPT (12 L h^2 + V h = 7.45e9 parameters) at 8192 tokens per rank, the projection's scale."""


def table(shape: GPTShape = GPT_7B, precision: str = "bf16") -> str:
    """Per-layer and total activation bytes at a few layouts, beside the paper's per-layer formula (GB)."""
    layouts = [("plain", Parallelism()), ("tp 8", Parallelism(tp=8)),
               ("tp 8 + sp", Parallelism(tp=8, sequence_parallel=True)),
               ("tp 8 + sp + vocab", Parallelism(tp=8, sequence_parallel=True, vocab_parallel=True)),
               ("full recompute", Parallelism(recompute="full")),
               ("tp 8 + sp, full recompute", Parallelism(tp=8, sequence_parallel=True, recompute="full"))]
    p = RunPrecision(precision)
    lines = [f"GPT L = {shape.layers}, h = {shape.hidden}, a = {shape.heads}, V = {shape.vocab}; b = {shape.batch} x s = "
             f"{shape.seq} tokens per rank; {p.describe()}; flash attention (dropout 0)",
             f"{'layout':<27}{'per layer GB':>13}{'paper GB':>10}{'layers GB':>11}{'head+loss GB':>14}{'total GB':>10}"]
    for name, par in layouts:
        a = activation_bytes(shape, p, par)
        lines.append(f"{name:<27}{a.per_layer / 1e9:>13.3f}{korthikanti(shape, par) / 1e9:>10.3f}"
                     f"{a.per_layer * a.layers / 1e9:>11.2f}{(a.embedding + a.head + a.loss) / 1e9:>14.2f}"
                     f"{a.total / 1e9:>10.2f}")
    lines.append("paper: Korthikanti et al. 2022, Table 2 (2-byte activations, 1-byte dropout masks, the 5 a s^2 b "
                 "attention term\nunless recomputed); full recompute adds one layer rebuilt inside backward")
    return "\n".join(lines)

