"""Build it yourself: DDP, a sharded optimizer, FSDP, TP, PP and CP, each in one short file.

The site's track (docs/tutorial/) quotes these files line for line; tests/tutorial/
proves each equal to one process on the whole batch. Read them in this order:

    ddp_naive      step 1: after backward, one blocking all_reduce per parameter
    ddp_flat       step 2: after backward, one all_reduce of all gradients flattened
    ddp_overlap    step 3: an async all_reduce per parameter, launched from its gradient hook
    ddp_bucketed   step 4: hooks fill buckets; a full bucket launches one async all_reduce
    sharded_optimizer   ZeRO-1: each rank keeps the optimizer state of its share only
    fsdp           parameters sharded along dim 0, gathered per module for forward and backward
    tp             column- and row-parallel Linear (Megatron-LM's f and g), the MLP they make
    pp             a stage per rank, micro-batches, GPipe and 1F1B over isend and recv
    cp             causal ring attention with the online softmax, its own backward
    model          the model every step is timed on (layers whose backward sleeps)
    measure        what each step costs: time, collectives, bytes traced and kernel-counted
    example        train any piece beside one process on the whole batch, and compare

Every class has CS336's shape: wrap the module, train as usual, and call
`finish_gradient_synchronization()` after backward. The real engines (minidist.ddp,
minidist.zero, minidist.fsdp) do the same work and more; each page says what.
Communication goes through minidist.comm, whose calls mirror torch.distributed's and
are recorded by minidist.comm.trace.
"""
