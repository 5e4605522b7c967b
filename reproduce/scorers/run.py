"""Run every scorer comparison whose checkouts are set and write docs/results/scorer_parity.md with its data
(docs/results/scorer_parity/<code>.json).

    DIFFUSION_NFT_PATH=... FLOW_GRPO_PATH=... AWM_PATH=... DGPO_PATH=... MIXGRPO_PATH=... DANCEGRPO_PATH=... \\
    HPSV2_PATH=... IMAGEREWARD_PATH=... REWARD_SERVER_CHECKOUT=... \\
        .venv/bin/python reproduce/scorers/run.py [--only clip,hps,image_reward,rules] [--out docs/results]

A comparison whose checkout variable is not set is listed as skipped with the variable to set. Exit status 1 when a
row is outside its tolerance.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scorers import CHECKOUTS, RESULTS, ROOT, ScorerReport, tolerance, write  # noqa: E402

MODULES = ("clip", "hps", "image_reward", "rules")

# the launches' combinations that several rows make together: (code, launch, rows' rewards, weights, where)
COMBINATIONS = [("diffusion_nft", "sd3_multi_reward", ("pickscore", "hpsv2", "clipscore"), (1.0, 1.0, 1.0),
                 "config/nft.py:128 reward_fn weights, flow_grpo/rewards.py multi_score: Σ weight·score")]


# read, not run: the official reward code that no row executes, and why
READ_ONLY = [
    "Flow-GRPO's recipes (reproduce/official/data/flow_grpo.yaml) were read at 9745241; no checkout or stored copy "
    "of that commit is here, so its rows compare ac4c86e (pickscore_scorer.py, imagereward_scorer.py, ocr.py and "
    "the rewards.py wrappers, which at the two other commits the code index stores, 54809b5 and 94e23ee, hand the "
    "scorers the same inputs) and yifan123/reward-server for GenEval. Its clipscore_sd3 launch uses "
    "flow_grpo/clip_scorer.py, which ac4c86e lacks: not compared. Its rewards.py clip_score hands ClipScorer the "
    "float tensor as DiffusionNFT's does; DGPO's copy of clip_scorer.py divides by 30 where DiffusionNFT's divides "
    "by 100, and which Flow-GRPO's divides by is unverified here (flowgrpo's docs had 30)",
    "DanceGRPO (XueZeyue/DanceGRPO fastvideo/train_grpo_flux.py:387-399, the launch's --use_hpsv2): HPSv2.1 scored "
    "inline in the training loop (create_model_and_transforms('ViT-H-14', light_augmentation=True), preprocess_val on "
    "the VAE's PIL image, cos of the output_dict features under CUDA autocast): the computation of MixGRPO's "
    "HPSClipRewardModel, whose row runs; flowgrpo spec {name: hpsv2} (defaults)",
    "DanceGRPO's --use_pickscore (train_grpo_flux.py:401-431, no launch uses it): the cosine alone, no logit scale, "
    "on the PNG the loop saved and read back (lossless): pickscore {divide_by: exp(logit_scale)} (≈ 100) would "
    "reproduce it",
    "SAGE-GRPO (Tencent-Hunyuan/SAGE-GRPO hyvideo/models/reward_models/rewards.py, no checkout can be fetched here): "
    "VideoAlign's heads (normalised by the checkpoint's inference_config mean/std, use_norm=True) summed with "
    "post_train.py's reward_weights {VQ: 0.5, MQ: 0.5, TA: 1.0}, model weight 1, on videos written to mp4 and read "
    "back: flowgrpo spec {name: videoalign, kwargs: {weights: {VQ: 0.5, MQ: 0.5, TA: 1.0}, backend: <VideoAlign with "
    "the checkpoint's normalisation>}}; the network and the mp4 round trip are not compared",
]


def run(only=MODULES) -> tuple[list[ScorerReport], list[str]]:
    reports, skipped = [], []
    for name in only:
        for row in importlib.import_module(f"scorers.{name}").rows():
            if isinstance(row, Exception):
                skipped.append(f"{name}: {row}")
            else:
                reports.append(row)
    reports.extend(combinations(reports))
    return reports, sorted(set(skipped))


def combinations(reports: list[ScorerReport]) -> list[ScorerReport]:
    out = []
    for code, launch, names, weights, where in COMBINATIONS:
        parts = {r.reward: r for r in reports if r.code == code and r.reward in names}
        if len(parts) != len(names):
            continue
        n = len(parts[names[0]].ours)
        ours = [sum(w * parts[k].ours[i] for k, w in zip(names, weights)) for i in range(n)]
        theirs = [sum(w * parts[k].theirs[i] for k, w in zip(names, weights)) for i in range(n)]
        first = parts[names[0]]
        out.append(ScorerReport(
            "+".join(names), code, first.repository, first.commit, where, [launch],
            {"rewards": [parts[k].spec | {"weight": w} for k, w in zip(names, weights)], "advantage.multi_reward": "sum"},
            "model", ours, theirs, tolerance(theirs),
            notes=["the weighted sum of the rows above (each row's scores are its official scorer's on the same "
                   "images and prompts); flowgrpo's advantage.multi_reward=sum adds the weighted rewards before the "
                   "group statistics, as multi_score's 'avg' enters DiffusionNFT's advantage"],
            differences=["the scales of the parts (above): PickScore/26 + HPSv2.1 + exp(logit_scale)·cos/100, "
                         "≈ 0.85 + 0.28 + 0.3 on real images: the sum weighs the three about equally only with the "
                         "official scales"]))
    return out


def markdown(reports: list[ScorerReport], skipped: list[str], command: str) -> str:
    from collections import Counter

    lines = [
        "# Scorer parity: flowgrpo's rewards against the official scorer code",
        "",
        "Each row runs one official code base's reward code (loaded from its checkout at run time) and flowgrpo's "
        "reward, built with the spec in the row, on the same tiny random-weight model of the scorer's architecture, "
        "the same images (four 512×512 float images as a VAE decode hands them, not on the uint8 grid) and the same "
        "prompts, and compares the per-sample scores that enter the advantage (after the official rewards.py's "
        "scaling). `model` rows compare the whole scorer; `rule` rows compare the rule around a network that cannot "
        "run here (OCR, GenEval detector, VLM server) on injected network outputs: the networks themselves are not "
        "compared. How each comparison is built: reproduce/scorers/ (its module docstrings).",
        "",
        f"Produced by: `{command}`",
        "",
        "| reward | official code | repository@commit file | launches | flowgrpo spec | max \\|Δ\\| | tolerance | equal |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        spec = ", ".join(f"{k}: {v}" for k, v in r.spec.get("kwargs", {}).items()) if "kwargs" in r.spec else \
            "sum of the rows' specs, weights 1"
        lines.append(f"| {r.reward} | {r.code} ({r.compared}) | {r.repository}@{r.commit[:7]} {r.official} | "
                     f"{'; '.join(r.launches)} | `{{{spec}}}` | {r.max_diff:.3g} | {r.tolerance:.3g} | "
                     f"{'yes' if r.ok else 'NO'} |")
    counts = Counter(r.ok for r in reports)
    lines += ["", f"{counts[True]} rows equal, {counts[False]} not.", ""]
    if skipped:
        lines += ["Not run (their checkouts not set):", ""] + [f"- {s}" for s in skipped] + [""]
    lines += ["Read, not run:", ""] + [f"- {s}" for s in READ_ONLY] + [""]
    lines += ["## Per row: what was compared, each difference found and what was done", ""]
    for r in reports:
        lines.append(f"### {r.reward} — {r.code}")
        lines.append("")
        lines.append(f"- official: {r.repository}@{r.commit} `{r.official}`; launches: {'; '.join(r.launches)}")
        lines.append(f"- tolerance: {r.tolerance:.3g} ({r.tolerance_reason}); max |Δ| {r.max_diff:.3g}; official "
                     f"scores {', '.join(f'{v:.6g}' for v in r.theirs[:8])}{' ...' if len(r.theirs) > 8 else ''}")
        lines += [f"- {n}" for n in r.notes]
        lines += [f"- difference: {d}" for d in r.differences]
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(MODULES), help="comma-separated modules of reproduce/scorers")
    parser.add_argument("--out", default=str(RESULTS), help="folder for scorer_parity.md and scorer_parity/")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    reports, skipped = run([m for m in args.only.split(",") if m])
    for r in reports:
        print(r.line())
    for s in skipped:
        print("skipped", s)
    out = Path(args.out)
    write(reports, out / "scorer_parity")
    variables = " ".join(f"{env}=..." for _, env in CHECKOUTS.values() if os.environ.get(env))
    command = f"{variables} .venv/bin/python reproduce/scorers/run.py" + \
        (f" --only {args.only}" if args.only != ",".join(MODULES) else "")
    (out / "scorer_parity.md").write_text(markdown(reports, skipped, command))
    print(f"wrote {(out / 'scorer_parity.md').relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    raise SystemExit(main())
