"""The launches of presets whose official code could not be read: the run their paper states, as a table.

Two presets follow papers whose code was not retrievable here, not even file by file: TreeGRPO (arXiv 2512.08153;
zh-ding/TreeGRPO) and V-GRPO (arXiv 2604.23380; tang-bd/v-grpo). The primary full texts could not be read either, so
each value below is the paper's as a secondary copy of its text or tables reproduces it, and its ``source`` names the
paper's place (equation, table, figure, appendix) and the copy it was read from. Only values the copies attribute to
the paper are here: a setting the paper leaves open (TreeGRPO's noise level and clip range, V-GRPO's FLUX learning
rate and group size, ...) is absent, its preset's comment saying what flowgrpo runs instead, and nothing inferred
(a step count read from an NFE sum, the code base a paper builds on) is written as the paper's.

Keys are the papers' own terms, not a config's (there is no config to read): ``tree.k``, ``likelihood.n_mc``, ...;
reproduce/official/map/papers.yaml says what each is in flowgrpo. Nothing is read from a checkout: ``ENV`` is None, and
``source(preset)`` gives write_data the paper in its stead (``reproduce/official/extract.py papers`` writes the
data; rerun it after editing a table here). A source never contains a colon: write_data takes ``file:line`` sources
as files of a checkout, and a paper has none (its data's ``commits`` are empty).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from official import ExtractionError, Launch, Value

REPOSITORY = "papers"
ENV = None  # no checkout: the values are this module's tables
PRESETS = ("treegrpo", "vgrpo")

# the paper each preset's launches come from (write_data's ``repository``)
PAPERS = {
    "treegrpo": "arXiv 2512.08153",
    "vgrpo": "arXiv 2604.23380",
}

# the secondary copies each table was read through
_TREE = "as reproduced by its paper notes (en.papernotes.org's English note; a Chinese note quoting Eq. 7-12)"
_S1 = "as reproduced by chengYi-xun's V-GRPO post"
_S1_S2 = "as reproduced by chengYi-xun's V-GRPO post and a Chinese V-GRPO note"
_S3 = "as quoted by a re-implementation's design notes"

NOTES = {
    "treegrpo": (
        "TreeGRPO's code (github.com/zh-ding/TreeGRPO) could not be read here, nor the paper's full text (arXiv "
        "2512.08153, ICLR 2026): this is the paper's SD3.5-Medium run on HPS-v2.1 (Table 1, the default tree of "
        "Table 3) as two secondary copies of the paper reproduce it, an English paper note on en.papernotes.org "
        "('[Paper Note] TreeGRPO') and a Chinese paper note quoting its Eq. 7-12 (the OpenReview reviews of forum "
        "3rZdp4TmUb agree on the comparisons). Values are written in reproduce/official/papers.py, each with the "
        "paper's place and the copy; what the paper leaves open (the SDE's noise level, the clip range, the CFG "
        "scale, the resolution, updates an epoch) is absent and flowgrpo's choice (configs/presets/treegrpo.yaml)."
    ),
    "vgrpo": (
        "V-GRPO's code (github.com/tang-bd/v-grpo) could not be read here, nor the paper's full text (arXiv "
        "2604.23380): these are its SD3.5-Medium stage-1 run and its FLUX.1-dev run as secondary copies reproduce "
        "them: chengYi-xun's V-GRPO blog post (github.com/chengYi-xun/chengYi-xun, source/_posts/60-v-grpo.md: "
        "Tables 1/2/3/5, Figs. 1-8, Alg. 1), a Chinese V-GRPO note, and the design notes of a third-party "
        "re-implementation quoting the paper's method sections and appendix (the stage-1 recipe, Eq. 14-17). Values "
        "are written in reproduce/official/papers.py, each with the paper's place and the copy; what they leave "
        "open (FLUX's group size, learning rate, fine-tuning and reward weights; the advantage's std; the clip range "
        "of the FLUX run; the optimizer) is absent and flowgrpo's choice (configs/presets/vgrpo.yaml)."
    ),
}


@dataclass
class Paper:
    """What write_data needs of a checkout, for a paper: its name (``repository``), how the values were read
    (``env``, shown in the data's ``generated_by``) and no files (``commit_of`` is never asked of a source without a
    colon)."""

    repository: str
    env: str = "no checkout: the paper's values, written in reproduce/official/papers.py"
    commits: dict[str, str] = field(default_factory=dict)

    def commit_of(self, relpath: str) -> str:
        return self.commits.get(relpath, "")


def source(preset: str) -> Paper:
    if preset not in PAPERS:
        raise ExtractionError(f"papers: no paper for {preset!r} (one of {', '.join(PRESETS)})")
    return Paper(PAPERS[preset])


def _v(value, where: str, via: str, paper: str) -> Value:
    return Value(value, f"{paper} {where}, {via}")


# ----------------------------------------------------------------------------------------------------- TreeGRPO
def _treegrpo() -> list[Launch]:
    def v(value, where, via=_TREE):
        return _v(value, where, via, PAPERS["treegrpo"])

    setup = "experimental setup"
    values = {
        # the model, its reward and prompts
        "model": v("SD3.5-Medium", f"{setup} (Table 1's base model)"),
        "reward": v("HPS-v2.1", "Table 1 (trained on HPS-v2.1)"),
        "prompts.train": v("HPDv2 (about 103.7k prompts)", setup),
        "prompts.eval": v("HPDv2 test (about 3.2k prompts)", setup),
        # the rollout: an ODE trunk, one SDE window in which every node branches
        "sampler.nfe": v(10, f"{setup} ('all methods use NFE = 10')"),
        "sampler.sde": v("the probability-flow ODE's marginal-preserving SDE, sigma(t) following Song et al.",
                         "method (the SDE window)"),
        "sampler.outside_window": v("ODE: a deterministic update of every frontier node, no branching",
                                    "method (ODE steps outside the window)"),
        "tree.trees_per_prompt": v(1, f"{setup} (one tree per prompt)"),
        "tree.k": v(3, "Table 3 (the default k = 3, d = 3, 27 leaves and 13 branching nodes)"),
        "tree.d": v(3, "Table 3 (the default k = 3, d = 3; the depth is the SDE window's length w)"),
        "tree.branching": v("every frontier node spawns k children at every step of the SDE window",
                            "method (the SDE window W = {i, ..., i + w - 1})"),
        "tree.child_noise": v("each child an SDE step with its own noise", "method (stochastic SDE perturbation)"),
        "window.distribution": v("truncated geometric, Pr[i] = (1 - r) r^i / (1 - r^(T - w)), i = 0 ... T - w - 1",
                                 "Eq. 7"),
        "window.r": v(0.5, f"{setup} (r = 0.5)"),
        "window.resampled": v("every epoch", "method (the window's start drawn at the start of each epoch)"),
        # credit: leaves normalised once, carried up the tree
        "advantage.leaf": v("z-score of the leaf scores over all leaves of the prompt", "Eq. 9"),
        "advantage.edge": v("the pi_old-weighted mean of the child edges' advantages, w_u(e) = pi_old(e) / sum over "
                            "siblings (a softmax of the stored child-edge log-probs); single-child (ODE) segments pass "
                            "it up unchanged, no renormalisation above the leaves", "Eq. 10-11"),
        # the loss
        "loss.objective": v("PPO clipped surrogate per trained edge, r_t(e) = pi_theta(e) / pi_old(e)", "Eq. 12"),
        "loss.trained_edges": v("the SDE window's edges only", "Eq. 12 (the sum over t in W)"),
        "loss.kl": v("none (no KL term, no reference model)", "Eq. 12"),
        # the optimizer and the run
        "train.optimizer": v("AdamW", setup),
        "train.learning_rate": v(1.0e-5, setup),
        "train.weight_decay": v(0.01, setup),
        "train.batch_size": v(32, f"{setup} (batch size 32)"),
        "train.epochs": v(250, setup),
        "train.precision": v("mixed precision", setup),
        "train.gpus": v("8 x A100", f"{setup} (Table 1's s/iter on 8 GPUs)"),
    }
    return [Launch("treegrpo_sd35m_hps", "sd3_5_medium", ["hpsv2"], values,
                   entry="arXiv 2512.08153 Table 1 (SD3.5-Medium trained on HPS-v2.1)")]


# ------------------------------------------------------------------------------------------------------- V-GRPO
def _vgrpo() -> list[Launch]:
    def v(value, where, via):
        return _v(value, where, via, PAPERS["vgrpo"])

    # the method: the same in every run (the surrogate, its draws and its ratio)
    method = {
        "likelihood.timesteps": v("stratified: the timestep schedule cut into N_MC equal chunks, one drawn from each, "
                                  "redrawn every iteration", "variance reduction (stratified timestep sampling)",
                                  _S1_S2),
        "likelihood.pairs": v("one set of (t, eps) pairs per prompt, shared by its G samples and by theta and "
                              "theta_old", "variance reduction (group-shared timestep-noise pairs)", _S1_S2),
        "likelihood.surrogate": v("x-prediction error over its detached mean absolute error (adaptive loss weighting)",
                                  "Eq. 14 and Fig. 6", _S3 + " and chengYi-xun's V-GRPO post"),
        "ratio": v("exp of the difference of the N_MC-mean surrogates (one ratio per sample)", "Alg. 1", _S1),
    }
    sd3 = {
        **method,
        "model": v("SD3.5-Medium", "appendix (the SD3.5-M stage-1 recipe)", _S3),
        "rewards": v(["HPSv2.1", "PickScore", "CLIP"], "appendix (the SD3.5-M stage-1 recipe)", _S3),
        "prompts": v("Pick-a-Pic", "appendix (the SD3.5-M stage-1 recipe)", _S3),
        "finetune": v("LoRA", "appendix (the SD3.5-M stage-1 recipe)", _S3),
        "lora.rank": v(32, "appendix (the SD3.5-M stage-1 recipe)", _S3),
        "lora.alpha": v(64, "appendix (the SD3.5-M stage-1 recipe)", _S3),
        "train.learning_rate": v(3.0e-4, "appendix (the SD3.5-M stage-1 recipe)", _S3),
        "group_size": v(24, "appendix (the SD3.5-M stage-1 recipe, 24 images x 48 prompts)", _S3),
        "prompts_per_iteration": v(48, "appendix (the SD3.5-M stage-1 recipe, 24 images x 48 prompts)", _S3),
        "resolution": v(720, "appendix (the SD3.5-M stage-1 recipe)", _S3),
        "sampler.steps": v(40, "Table 5 (NFE 40 + 6.9) and the stage-1 recipe", _S1 + " and " + _S3),
        "sampler.solver": v("DPM-Solver++, deterministic ODE", "Alg. 1 and the stage-1 recipe", _S1 + " and " + _S3),
        "sampler.cfg": v("none", "Table 5 (40 steps without CFG) and the stage-1 recipe", _S1 + " and " + _S3),
        "likelihood.n_mc": v(4, "appendix (the SD3.5-M stage-1 recipe) and Fig. 4f", _S3 + " and " + _S1_S2),
        "gradient_steps_per_iteration": v(1, "appendix (the SD3.5-M stage-1 recipe, fully on-policy)", _S3),
        "ratio_clip": v("none", "the gradient-step control table (SD3.5-M stages 1 and 3) and the stage-1 recipe",
                        _S1 + " and " + _S3),
        "kl": v("none", "the gradient-step control table (SD3.5-M stages 1 and 3) and the stage-1 recipe",
                _S1 + " and " + _S3),
        "advantage.soft_clip": v(3.0, "Eq. 17 (A' = eta tanh(A / eta)) and the stage-1 recipe (eta = 3)", _S3),
        "iterations": v(150, "Table 5 (stage 1, human preference) and the stage-1 recipe", _S1 + " and " + _S3),
    }
    flux = {
        **method,
        "model": v("FLUX.1-dev", "Table 1", _S1),
        "rewards": v(["HPSv2.1", "PickScore", "ImageReward", "UnifiedReward"], "Table 1 (the reward ensemble)", _S1),
        "sampler.steps": v(16, "Table 1 (NFE 16 + 4)", _S1),
        "sampler.solver": v("DPM-Solver++, deterministic ODE", "Alg. 1", _S1_S2),
        "likelihood.n_mc": v(4, "Table 1 (NFE 16 + 4, NFE_theta 4) and Fig. 4f", _S1_S2),
        "ratio_clip": v("yes (its range not stated)", "the gradient-step control table (FLUX main)", _S1),
        "kl": v("none", "the gradient-step control table (FLUX main)", _S1),
        "advantage.soft_clip": v("none", "the gradient-step control table (FLUX main)", _S1),
        "iterations": v(300, "Table 1 (300 iterations)", _S1),
    }
    return [
        Launch("vgrpo_sd35m_stage1", "sd3_5_medium", ["hpsv2", "pickscore", "clipscore"], sd3,
               entry="arXiv 2604.23380 appendix (SD3.5-Medium stage 1 of its five-stage curriculum, Table 5)"),
        Launch("vgrpo_flux_dev", "flux_dev", ["hpsv2", "pickscore", "imagereward"], flux,
               entry="arXiv 2604.23380 Table 1 (FLUX.1-dev, 300 iterations)"),
    ]


TABLES = {"treegrpo": _treegrpo, "vgrpo": _vgrpo}


def launches(paper: Paper, preset: str) -> list[Launch]:
    if preset not in TABLES:
        raise ExtractionError(f"papers: no launches for {preset!r}")
    out = TABLES[preset]()
    for launch in out:
        for key, value in launch.values.items():
            if ":" in value.source or not value.source.startswith(paper.repository):
                raise ExtractionError(f"papers: {preset} {launch.name} {key}: a source names its paper first and "
                                      f"has no colon ({value.source!r})")
        if ":" in launch.entry:
            raise ExtractionError(f"papers: {preset} {launch.name}: the entry has a colon ({launch.entry!r})")
    return out
