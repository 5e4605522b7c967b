"""The worlds flowgrpo runs on without a GPU: data, prompts and their verifiable structure (torch and numpy only).

    worlds.toy.scenes   toy images: rendered scenes of coloured shapes, a GenEval-like prompt grammar, fixed splits
    worlds.toy.clips    toy videos: clips of moving shapes, their grammar and splits
    worlds.analytic     a Gaussian mixture whose flow is known in closed form (the KL-regularised optimum too)

Their scorers are rewards (rewards/toy/, rewards/analytic.py); the tiny models trained on them are
flowgrpo/tiny/. Docs: docs/toy_world.md, docs/analytic_world.md.
"""
