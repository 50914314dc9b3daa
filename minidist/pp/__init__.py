"""minidist.pp: pipeline parallelism, the model's depth split over ranks, built on send and recv.

    cut = pp.split_gpt(GPT(cfg), num_stages=p * v)             # every rank cuts the same model
    stages = [pp.Stage(cut.modules[s], s, cut.num_stages) for s in pp.stages_of(rank, p, v)]
    sched = pp.build("1f1b", pp=p, microbatches=m)              # data: each rank's list of actions
    pipe = pp.Pipeline(stages, sched, mesh["pp"], cut.loss_fn, ties=cut.ties)   # checks the schedule
    loss = pipe.step(x, target=y)                               # on the last stage's rank; else None
    optimizer.step()                                            # over pipe.parameters()

Read in this order:
  schedule.py    schedules as data: per rank a list of F, B (or BI and BW), SEND and RECV
                 actions; the builders GPipe, 1F1B, interleaved 1F1B and ZB-H1
  check.py       a schedule proven before it runs: coverage, order, message pairing, no
                 deadlock (its blocking order simulated), activations held; one-line refusals
  cost.py        the bubble, the bytes per boundary, the activations held, by formula
  stage.py       cutting a model into stages (GPT by blocks, nn.Sequential by split points)
  microbatch.py  the batch in m equal pieces; the loss scaled by 1/m
  backward.py    a backward in two halves, input (BI) and weights (BW), for zero-bubble schedules
  runtime.py     Pipeline: walks one rank's list with batched isend/irecv (minidist.comm.p2p)
  forward.py     forward only, stage after stage (evaluation)
  compose.py     with data parallelism (one reduction per step per stage, or ZeRO's once after the
                 schedule), tied weights, clipping

The trade-off in one line: p ranks, m micro-batches, point-to-point bytes 2 m b s h e per
stage boundary per step (the least of any strategy), and a bubble of (p-1)/(m+p-1) of every
rank's time (GPipe, 1F1B) that no other strategy has; 1F1B holds p activations where GPipe
holds m, interleaving divides the bubble by v, ZB-H1 fills most of it with weight gradients.
"""

from minidist.pp import cost
from minidist.pp.check import ScheduleError, check, simulate
from minidist.pp.compose import Deferred, clip_grad_norm_, deferred, gradient_sync
from minidist.pp.forward import forward_loss
from minidist.pp.runtime import Pipeline
from minidist.pp.schedule import BUILDERS, Action, Kind, Schedule, build, gpipe, interleaved_1f1b, one_f_one_b, \
    stages_of, zb_h1
from minidist.pp.stage import Cut, GPTStage, Stage, Tie, split_gpt, split_sequential

__all__ = [
    "cost", "ScheduleError", "check", "simulate", "clip_grad_norm_", "gradient_sync", "Deferred", "deferred",
    "forward_loss", "Pipeline", "BUILDERS",
    "Action", "Kind", "Schedule", "build", "gpipe", "interleaved_1f1b", "one_f_one_b", "stages_of", "zb_h1",
    "Cut", "GPTStage", "Stage", "Tie", "split_gpt", "split_sequential",
]
