"""The engine: the training loop and everything it talks to.

    trainer.py       the recipe: SAMPLE -> SCORE -> ADVANTAGE -> UPDATE -> LOG/SAVE, top to bottom
    rollout.py       SAMPLE: prompt draws, the plan's rollout, decoding, sending leaves to the rewards
    scoring.py       SCORE: the run's rewards in a worker thread, their failures named
    credit.py        ADVANTAGE: every credit-assignment rule (group, GDPO, tree, best-of-N, clipping)
    policy.py        the trainable model and every copy of its weights; the surface a learner sees
    copies.py        the one copy-of-the-weights mechanism (EMA, soft copies, anchors, snapshots)
    learners/        UPDATE: the transition learner and the forward-process learners (NFT, AWM, DGPO)
    loss.py          the clipped policy loss, KL terms and step weights of the transition learner
    noise_scale.py   the gradient noise scale, measured during training
    evaluation.py    held-out evaluation and the end-of-run summary
    checkpointing.py what a checkpoint holds, saving and resuming

The engine never imports the gallery or the command lines; learners never import the trainer.
"""
