"""Inject one fault at a time into a copy of a tree and run the tests that should catch it (the power check of issues
46 and 60: the suite must fail on each fault, before and after a change to the tests).

    python benchmarks/inject_faults.py OUT.json [NAME_PART ...] [--tree DIR] [--work DIR] [--python PATH]
                                       [--class CLASS ...] [--append] [--no-confirm] [--timeout S]
    python benchmarks/inject_faults.py --check [--tree DIR]         every fault applies to DIR (no tests run)
    python benchmarks/inject_faults.py --list                       the faults, by class
    python benchmarks/inject_faults.py --table BEFORE.json AFTER.json   the markdown table fault -> caught by, before/after

Each fault of ``FAULTS`` is a plain text replacement (or a few, in one file) in the library code. The tree (``--tree``,
default the checkout this script lives in; without .git, the venv and run folders) is copied to ``--work`` (default
/tmp/injected), the replacement made, and ``pytest -x -rfE`` run there on the fault's tests with ``--python`` (default
this interpreter), cwd = the copy and PYTHONPATH = the copy, so the copy's packages are imported even by an
interpreter whose editable install maps flowgrpo to another checkout (checked for every fault: the mutated module must
resolve inside the copy; the multi-process tests' launches inherit PYTHONPATH). A fault is "caught" when a test fails
(pytest exit 1; the failing test ids, pytest's "FAILED ..." lines, are recorded), "MISSED" when every test passes,
"NOT APPLIED" when its text is not in the tree. OUT is rewritten after every fault. At the end (unless --no-confirm)
the tests that caught a fault are run once on the unmodified copy: each must pass there, or its catch is no evidence
(recorded under "confirm").

The classes (``--class``): wiring (the 31 injections named by tests/engine/test_wiring.py's "Catches:" sentences; how
they are counted: ``WIRING_COUNT`` below), loop (issue 46's other update-loop faults), velocity (each family adapter's
time convention), lora (each family's saved LoRA, LoRA targets), sign (each learner's loss sign), distributed (the
gradient sums over processes and over a context group), config (one key's rule skipped).

Issue 60's table (run each on its own tree; they may run at the same time with different --work folders):

    # before: the tree before the change (its own venv; cheap classes first, then the multi-process ones)
    python benchmarks/inject_faults.py docs/results/faults_before.json --tree /work/base \\
        --python /work/base/.venv/bin/python --work /tmp/injected_base
    # after: this checkout with its own venv (first --check: its library code may have moved under a fault's text)
    .venv/bin/python benchmarks/inject_faults.py --check
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/inject_faults.py docs/results/faults_after.json --work /tmp/injected_after
    # the table
    python benchmarks/inject_faults.py --table docs/results/faults_before.json docs/results/faults_after.json

A run can be split (``--class wiring``, then ``--class distributed --append``...): --append keeps OUT's other faults.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1]
W = ["tests/engine/test_wiring.py", "tests/engine/test_update_split.py", "tests/engine/test_tied_and_diverse.py"]
FAM = "tests/engine/test_families.py"
# the transition learner's cases fail without a fault on the tree before issue 60's change (on this machine,
# 2026-12-07: flow_grpo, flow_grpo-full, flow_grpo-muon seen, at test_sharded.py line 118, the 2-process run's ratio at
# inner epoch 0 not exactly 1; branchgrpo has the same exact check), so they catch nothing there; the sharded faults
# are run on the other cases
SHARDED_SKIP = [a for case in ("flow_grpo", "flow_grpo-full", "flow_grpo-muon", "branchgrpo")
                for a in ("--deselect", f"tests/engine/test_sharded.py::test_sharded_equals_one_process[{case}]")]
PF = FAM + "::test_preset_trains_on_family"
LEARN = "tests/engine/test_learning.py::test_every_preset_raises_the_reward"
SIGN = ["tests/engine/test_learner_formulas.py", "tests/engine/test_forward_learners.py", "tests/engine/test_wiring.py"]
LORA_SAVE = "transformer_lora_layers=get_peft_model_state_dict(network, state_dict=state, adapter_name=ADAPTER_NAME),"


def lora_zeroed(when: str) -> str:
    """The saved LoRA zeroed where ``when`` (a Python condition in TrainableModel._save_expert) holds."""
    return ("transformer_lora_layers={k: v * 0 if " + when + " else v for k, v in get_peft_model_state_dict("
            "network, state_dict=state, adapter_name=ADAPTER_NAME).items()},")


BASE_CALL = "return transformer(hidden_states=x, timestep=self._model_time(sigma),"
FLUX2_T = "timestep=t.to(self.dtype) / 1000,"

# (class, name, file, [(text, its replacement), ...], the tests that should catch it: paths, node ids or pytest options)
FAULTS = [
 # ---------------------------------------------------------------- issue 46's update-loop faults (flowgrpo/engine/learners/)
 ("loop", "loop: step normaliser dropped", "flowgrpo/engine/learners/base.py", [("loss = loss / step.normaliser", "loss = loss")], W),
 ("loop", "loop: zero_grad removed", "flowgrpo/engine/learners/base.py", [("                policy.zero_grad()\n", "")], W),
 ("wiring", "loop: contract over every step", "flowgrpo/engine/learners/base.py", [("first = epoch == 0 and u == 0", "first = True")], W),
 ("wiring", "loop: one inner epoch only", "flowgrpo/engine/learners/base.py", [("for epoch in range(t.inner_epochs):", "for epoch in range(1):")], W),
 ("loop", "loop: filler's loss not zeroed", "flowgrpo/engine/learners/base.py", [("policy.backward(loss * 0.0)", "policy.backward(loss)")], W + ["tests/engine/test_sharded.py", *SHARDED_SKIP]),
 ("loop", "transition: 1/U dropped", "flowgrpo/engine/learners/transition.py", [("row.coef * U if real", "row.coef if real")], W),
 ("loop", "transition: filler with weight", "flowgrpo/engine/learners/transition.py", [("[row.coef * U if real else 0.0 for row in part]", "[row.coef * U for row in part]")], W),
 ("loop", "transition: groups not in normaliser", "flowgrpo/engine/learners/transition.py", [(" * max(1, total_groups))", ")")], W),
 ("loop", "forward: tied samples trained", "flowgrpo/engine/learners/forward.py", [("chosen = {g: [i for i in members if not samples[i].tied]", "chosen = {g: [i for i in members]")], W),
 ("wiring", "forward: K dropped from normaliser", "flowgrpo/engine/learners/forward.py", [("rows = sum(len(by_group[g]) for g in chunk) * self.cfg.learner.train_times", "rows = sum(len(by_group[g]) for g in chunk)")], W),
 ("wiring", "awm: / adv_max dropped", "flowgrpo/engine/learners/awm.py", [("adv / lc.adv_max", "adv")], W),
 # ---------------------------------------------------------------- the family adapters: the velocity's time convention, the LoRA
 ("velocity", "sd3/wan: timestep sigma not sigma*T", "flowgrpo/models/base.py", [(BASE_CALL, "return transformer(hidden_states=x, timestep=sigma.to(x.device),")], ["tests/models/test_sd3.py", "tests/models/test_wan.py"]),
 ("velocity", "flux: t not t/1000", "flowgrpo/models/flux.py", [("timestep=t.to(self.dtype) / 1000,", "timestep=t.to(self.dtype),")], ["tests/models/test_flux.py"]),
 ("velocity", "flux2: t not t/1000", "flowgrpo/models/flux2.py", [(FLUX2_T, "timestep=t.to(self.dtype),")], ["tests/models/test_flux2.py"]),
 ("velocity", "qwen_image: t not t/1000", "flowgrpo/models/qwen_image.py", [("timestep=t.to(self.dtype) / 1000,", "timestep=t.to(self.dtype),")], ["tests/models/test_qwen_image.py"]),
 ("velocity", "z_image: t/1000 not (1000-t)/1000", "flowgrpo/models/z_image.py", [("timestep = (1000 - t) / 1000", "timestep = t / 1000")], ["tests/models/test_z_image.py"]),
 ("lora", "flux2: single blocks not LoRA-trained", "flowgrpo/models/flux2.py", [('return [*DEFAULT_LORA_TARGETS, "attn.to_qkv_mlp_proj",', 'return [*DEFAULT_LORA_TARGETS, "attn.to_qkv_mlp_proj"]; [')], ["tests/models/test_flux2.py"]),
 ("lora", "LoRA save: empty state", "flowgrpo/models/trainable.py", [(LORA_SAVE, "transformer_lora_layers={k: v * 0 for k, v in get_peft_model_state_dict(network, state_dict=state, adapter_name=ADAPTER_NAME).items()},")], [PF]),
 # one family at a time (the shared code made wrong for that family's adapter alone)
 ("velocity", "sd3 only: timestep sigma not sigma*T", "flowgrpo/models/base.py", [(BASE_CALL, BASE_CALL.replace("self._model_time(sigma)", 'self._model_time(sigma) if type(self).__name__ != "SD3Model" else sigma.to(x.device)'))], ["tests/models/test_sd3.py"]),
 ("velocity", "wan only: timestep sigma not sigma*T", "flowgrpo/models/base.py", [(BASE_CALL, BASE_CALL.replace("self._model_time(sigma)", 'self._model_time(sigma) if type(self).__name__ != "WanModel" else sigma.to(x.device)'))], ["tests/models/test_wan.py"]),
 ("velocity", "wan22 TI2V-5B: per-token timestep sigma not sigma*T", "flowgrpo/models/wan.py", [("timestep = self._model_time(sigma)[:, None].expand(-1, tokens)", "timestep = sigma[:, None].expand(-1, tokens)")], ["tests/models/test_wan22.py"]),
 ("velocity", "wan22 A14B: experts swapped at the boundary", "flowgrpo/models/base.py", [("((high, names[0]), (~high, names[1]))", "((~high, names[0]), (high, names[1]))")], ["tests/models/test_wan22.py"]),
 ("velocity", "flux2 dev only: t not t/1000", "flowgrpo/models/flux2.py", [(FLUX2_T, 'timestep=t.to(self.dtype) / (1 if type(self).__name__ == "Flux2Model" else 1000),')], ["tests/models/test_flux2.py"]),
 ("velocity", "flux2_klein only: t not t/1000", "flowgrpo/models/flux2.py", [(FLUX2_T, 'timestep=t.to(self.dtype) / (1 if type(self).__name__ == "Flux2KleinModel" else 1000),')], ["tests/models/test_flux2.py"]),
 ("velocity", "analytic: mixture velocity at 1-sigma", "flowgrpo/models/analytic.py", [("mixture_velocity(x, sigma,", "mixture_velocity(x, 1 - sigma,")], ["tests/worlds/test_analytic_world.py"]),
 ("lora", "sd3: saved LoRA zeroed", "flowgrpo/models/trainable.py", [(LORA_SAVE, lora_zeroed('type(self).__name__ == "SD3Model"'))], ["tests/models/test_sd3.py::test_save_and_load_lora_round_trips_exactly"]),
 ("lora", "flux: saved LoRA zeroed", "flowgrpo/models/trainable.py", [(LORA_SAVE, lora_zeroed('type(self).__name__ == "FluxModel"'))], ["tests/models/test_flux.py::test_lora_targets_reference_and_round_trip"]),
 ("lora", "wan: saved LoRA zeroed", "flowgrpo/models/trainable.py", [(LORA_SAVE, lora_zeroed('type(self).__name__ == "WanModel" and len(self.experts) == 1'))], ["tests/models/test_wan.py::test_save_and_load_lora_round_trips_and_loads_into_the_pipeline"]),
 ("lora", "wan22: second expert's saved LoRA zeroed", "flowgrpo/models/trainable.py", [(LORA_SAVE, lora_zeroed('expert == "transformer_2"'))], ["tests/models/test_wan22.py::test_saved_loras_load_into_the_pipeline", PF + "[wan2_2-flow_grpo]"]),
 ("lora", "qwen_image: saved LoRA zeroed", "flowgrpo/models/trainable.py", [(LORA_SAVE, lora_zeroed('type(self).__name__ == "QwenImageModel"'))], ["tests/models/test_qwen_image.py::test_lora_loads_into_the_pipeline_and_round_trips", PF + "[qwen_image-flow_grpo]"]),
 ("lora", "flux2 dev: saved LoRA zeroed", "flowgrpo/models/trainable.py", [(LORA_SAVE, lora_zeroed('type(self).__name__ == "Flux2Model"'))], ["tests/models/test_flux2.py::test_dev_lora_loads_into_the_pipeline", PF + "[flux2-flow_grpo]"]),
 ("lora", "flux2_klein: saved LoRA zeroed", "flowgrpo/models/trainable.py", [(LORA_SAVE, lora_zeroed('type(self).__name__ == "Flux2KleinModel"'))], ["tests/models/test_flux2.py::test_klein_lora_loads_into_the_pipeline", PF + "[flux2_klein-flow_grpo]"]),
 ("lora", "z_image: saved LoRA zeroed", "flowgrpo/models/trainable.py", [(LORA_SAVE, lora_zeroed('type(self).__name__ == "ZImageModel"'))], ["tests/models/test_z_image.py::test_lora_loads_into_the_pipeline_and_round_trips", PF + "[z_image-flow_grpo]"]),
 # ---------------------------------------------------------------- tests/engine/test_wiring.py's "Catches:" (WIRING_COUNT); 4 more are above
 # 2. the KL terms
 ("wiring", "wiring: KL sign flipped (AWM)", "flowgrpo/engine/learners/awm.py", [("total = total + coef * kl.sum()", "total = total - coef * kl.sum()")], W),
 ("wiring", "wiring: KL coefficient dropped (NFT kl_coef)", "flowgrpo/engine/learners/nft.py", [("total = total + lc.kl_coef * kl.sum()", "total = total + kl.sum()")], W),
 ("wiring", "wiring: KL against the wrong weights (AWM: the EMA for the reference)", "flowgrpo/engine/learners/awm.py", [("v_ref = self.velocity(x_t, t, cond, weights=REFERENCE) if lc.kl_coef > 0", "v_ref = self.velocity(x_t, t, cond, weights=self.ema) if lc.kl_coef > 0")], W),
 ("wiring", "wiring: loss normalised per micro-batch", "flowgrpo/engine/learners/base.py", [("loss = loss / step.normaliser", 'loss = loss / (sum(len(getattr(m, "draws", (0,))) for m in part) if real else step.normaliser)')], W),
 # 3. the copies of the weights
 ("wiring", "wiring: copy follows at the wrong time (NFT's theta_old every step)", "flowgrpo/engine/learners/nft.py", [('soft_copy(policy, "old", cfg.learner.nft.old, follows="iteration")', 'soft_copy(policy, "old", cfg.learner.nft.old, follows="step")')], W),
 ("wiring", "wiring: wrong lambda (rate*(n-1))", "flowgrpo/models/copies.py", [("after = n - delay", "after = n - delay - 1")], W),
 ("wiring", "wiring: copy not followed (the per-iteration copies)", "flowgrpo/engine/policy.py", [('        self._follow("iteration")', "        pass")], W),
 ("wiring", "wiring: copy follows another tensor (the gradient)", "flowgrpo/engine/policy.py", [("copy.follow(self.params, self.optimizer_steps)", "copy.follow([p.grad if p.grad is not None else p for p in self.params], self.optimizer_steps)")], W),
 ("wiring", "wiring: AWM's l_old snapshotted late (after each step)", "flowgrpo/engine/learners/awm.py", [('policy.copy("awm_old", follows="never", saved=False)', 'policy.copy("awm_old", follows="step", saved=False)')], W),
 # 4. DGPO's comparisons
 ("wiring", "wiring: DGPO grouped by sample", "flowgrpo/engine/learners/dgpo.py", [("keys = group_of_sample[index] * K + draw", "keys = index * K + draw")], W),
 ("wiring", "wiring: DGPO grouped by batch", "flowgrpo/engine/learners/dgpo.py", [("keys = group_of_sample[index] * K + draw", "keys = draw * 0")], W),
 ("wiring", "wiring: DGPO grouped by draw only", "flowgrpo/engine/learners/dgpo.py", [("keys = group_of_sample[index] * K + draw", "keys = draw")], W),
 ("wiring", "wiring: DGPO grouped by group across draws", "flowgrpo/engine/learners/dgpo.py", [("keys = group_of_sample[index] * K + draw", "keys = group_of_sample[index]")], W),
 ("wiring", "wiring: DGPO beta's placement (G/beta -> G)", "flowgrpo/engine/learners/dgpo.py", [("total = (sizes / dg.beta * objective).sum()", "total = (sizes * objective).sum()")], W),
 ("wiring", "wiring: DGPO clip against theta", "flowgrpo/engine/learners/dgpo.py", [("clipped = dgpo_clip_mask(err, err_old, adv, dg.clip_range)", "clipped = dgpo_clip_mask(err, err.detach(), adv, dg.clip_range)")], W),
 ("wiring", "wiring: DGPO clip against the reference", "flowgrpo/engine/learners/dgpo.py", [("clipped = dgpo_clip_mask(err, err_old, adv, dg.clip_range)", "clipped = dgpo_clip_mask(err, err_ref, adv, dg.clip_range)")], W),
 # 5. the normaliser of an optimizer step (K dropped: above; per micro-batch: in 2.)
 ("wiring", "wiring: normalised by groups", "flowgrpo/engine/learners/forward.py", [("rows = sum(len(by_group[g]) for g in chunk) * self.cfg.learner.train_times", "rows = len(chunk)")], W),
 ("wiring", "wiring: normalised by draws", "flowgrpo/engine/learners/forward.py", [("rows = sum(len(by_group[g]) for g in chunk) * self.cfg.learner.train_times", "rows = self.cfg.learner.train_times")], W),
 ("wiring", "wiring: normalised per group (mean of group means)", "flowgrpo/engine/learners/forward.py", [
     ("            normaliser = self.normalisation(samples, list(chunk), chunk)\n",
      "            normaliser = self.normalisation(samples, list(chunk), chunk)\n"
      "            self._w = {g: sum(len(v) for v in chunk.values()) / len(chunk) / len(v) for g, v in chunk.items()}\n"),
     ("adv = torch.tensor([m.sample.advantage for m in members])",
      'adv = torch.tensor([m.sample.advantage * getattr(self, "_w", {}).get(m.sample.group, 1.0) for m in members])')], W),
 ("wiring", "wiring: normalised by the iteration's rows", "flowgrpo/engine/learners/forward.py", [("normaliser = self.normalisation(samples, list(chunk), chunk)", "normaliser = self.normalisation(samples, list(work.by_group), work.by_group)")], W),
 ("wiring", "wiring: the masked leaf counted", "flowgrpo/engine/learners/forward.py", [
     ("                if math.isnan(a):\n                    continue\n", "                if math.isnan(a):\n                    a = 0.0\n"),
     ("masks is not None and bool(masks[bi][i])))", "math.isnan(float(adv[i])) or (masks is not None and bool(masks[bi][i]))))")], W),
 # 6. DiffusionNFT's implicit policies
 ("wiring", "wiring: NFT v- computed like v+", "flowgrpo/engine/learners/nft.py", [("v_pos, v_neg = v_old + step, v_old - step", "v_pos, v_neg = v_old + step, v_old + step")], W),
 ("wiring", "wiring: NFT v_old from theta", "flowgrpo/engine/learners/nft.py", [("v_old = self.velocity(x_t, t, cond, weights=self.old)", "v_old = self.velocity(x_t, t, cond).detach()")], W),
 ("wiring", "wiring: NFT v_old from the reference", "flowgrpo/engine/learners/nft.py", [("v_old = self.velocity(x_t, t, cond, weights=self.old)", "v_old = self.velocity(x_t, t, cond, weights=REFERENCE)")], W),
 ("wiring", "wiring: NFT r and 1-r swapped", "flowgrpo/engine/learners/nft.py", [("loss = adv_max * (r * losses[0] + (1.0 - r) * losses[1]) / beta", "loss = adv_max * ((1.0 - r) * losses[0] + r * losses[1]) / beta")], W),
 ("wiring", "wiring: NFT adaptive weight shared by both terms", "flowgrpo/engine/learners/nft.py", [("        weight = _mean_d(err.abs()).detach().clamp(min=1e-5)", "        weight = weight if losses else _mean_d(err.abs()).detach().clamp(min=1e-5)")], W),
 # 7. the loop (an inner epoch skipped, the contract over every step: above)
 ("wiring", "wiring: an update skipped", "flowgrpo/engine/learners/base.py", [("                first = epoch == 0 and u == 0\n", "                first = epoch == 0 and u == 0\n                if u == 1:\n                    continue\n")], W),
 # ---------------------------------------------------------------- each learner's loss sign (the policy term where micro_loss forms it)
 ("sign", "sign: transition learner's policy term", "flowgrpo/engine/learners/transition.py", [("total = total + (c * (w * loss + kl)).sum()", "total = total + (c * (-w * loss + kl)).sum()")], SIGN + [LEARN + "[flow_grpo]"]),
 ("sign", "sign: diffusion_nft's loss", "flowgrpo/engine/learners/nft.py", [("total = loss.sum()", "total = -loss.sum()")], SIGN + [LEARN + "[diffusion_nft]"]),
 ("sign", "sign: awm's loss", "flowgrpo/engine/learners/awm.py", [("total = loss.sum()", "total = -loss.sum()")], SIGN + [LEARN + "[awm]"]),
 ("sign", "sign: dgpo's loss", "flowgrpo/engine/learners/dgpo.py", [("total = (sizes / dg.beta * objective).sum()", "total = -(sizes / dg.beta * objective).sum()")], SIGN + [LEARN + "[dgpo]"]),
 ("sign", "sign: crd's loss", "flowgrpo/engine/learners/crd.py", [("total = loss.sum()", "total = -loss.sum()")], SIGN + [LEARN + "[crd]"]),
 # ---------------------------------------------------------------- one key's rule skipped where a config is checked
 ("config", "config: train.learning_rate's rule skipped", "flowgrpo/config/check.py", [("elif f.name in rules and not rules[f.name].ok(value):", 'elif f.name in rules and key != "train.learning_rate" and not rules[f.name].ok(value):')], ["tests/engine/test_config_rules.py"]),
 # ---------------------------------------------------------------- the gradient sums over processes (multi-process: minutes each)
 ("distributed", "distributed: gradient all-reduce skipped (processes without FSDP2)", "flowgrpo/engine/policy.py", [("                    torch.distributed.all_reduce(p.grad)\n", "                    pass  # the gradient all-reduce skipped\n")], ["tests/engine/test_train_distributed.py::test_two_processes_equal_one[flow_grpo-trained_transitions]"]),
 ("distributed", "distributed: FSDP2's gradient reduce-scatter skipped (sharded run)", "flowgrpo/engine/sharding.py", [("                unit.set_force_sum_reduction_for_comms(True)\n", "                unit.set_force_sum_reduction_for_comms(True)\n                unit.set_requires_gradient_sync(False)\n")], ["tests/engine/test_sharded.py::test_sharded_equals_one_process[awm]"]),
 ("distributed", "distributed: the context group left out of the gradient sum", "flowgrpo/engine/policy.py", [("torch.distributed.all_reduce(p.grad)", 'torch.distributed.all_reduce(p.grad, group=None if self.layout.mesh is None else self.layout.mesh.get_group("data"))')], ["tests/engine/test_context_parallel.py::test_wan_split_over_two_processes_equals_one[flow_grpo]"]),
]
CLASSES = ("wiring", "loop", "velocity", "lora", "config", "sign", "distributed")

WIRING_COUNT = """How the 31 injections of tests/engine/test_wiring.py's "Catches:" sentences are counted: each item of a sentence
(separated by commas or semicolons) is one fault, and an item naming alternatives joined by "or" is one fault per
alternative; a parenthesis (the examples of an item) and a slash are not split; an error two sentences name is one:
  1 AWM's scale             / adv_max dropped                                                            1
  2 the KL terms            sign flipped | coefficient dropped/scaled | wrong weights | per micro-batch  4
  3 the copies              wrong time | wrong lambda | not followed | another tensor | l_old late       5
  4 DGPO                    by sample | by batch | by draw only | across draws | beta | clip vs theta | clip vs reference  7
  5 the normaliser          K dropped | by groups | by draws | per group | (per micro-batch: in 2) | iteration's rows | masked leaf  6
  6 NFT                     v- like v+ | v_old from theta | v_old from the reference | r swapped | w shared  5
  7 the loop                an inner epoch skipped | an update skipped | the contract over every step    3
                                                                                                        31
(the four of these that issue 46 had already: "awm: / adv_max dropped", "forward: K dropped from normaliser",
"loop: one inner epoch only", "loop: contract over every step")."""

IGNORED = shutil.ignore_patterns(".git", ".venv", ".peers", ".whl", "runs", "__pycache__", "*.egg-info", ".pytest_cache")


def copy_tree(tree: Path, work: Path) -> None:
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(tree, work, ignore=IGNORED)


def apply(work: Path, f: str, edits) -> bool:
    """Make the fault's replacements in the copy; False when a text is not there."""
    p = work / f
    if not p.is_file():
        return False
    s = p.read_text()
    for old, new in edits:
        if old not in s:
            return False
        s = s.replace(old, new)
    p.write_text(s)
    return True


def environment(work: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{work}{os.pathsep}{os.environ.get('PYTHONPATH', '')}".rstrip(os.pathsep)}
    env.setdefault("OMP_NUM_THREADS", "1")
    env["COLUMNS"] = "400"  # pytest's short summary keeps this much of each failure's message
    env.pop("PYTEST_ADDOPTS", None)
    return env


def resolves_inside(python: str, work: Path, f: str) -> str | None:
    """None when the module of file ``f`` is imported from the copy by ``python`` in the test environment, else where."""
    module = f[:-3].replace("/", ".").removesuffix(".__init__")
    code = f"import importlib.util as u; print(u.find_spec({module!r}).origin)"
    r = subprocess.run([python, "-c", code], cwd=work, env=environment(work), capture_output=True, text=True, timeout=300)
    origin = r.stdout.strip()
    return None if origin and Path(origin).resolve() == (work / f).resolve() else (origin or r.stderr[-500:])


def pytest(python: str, work: Path, tests: list[str], timeout: int) -> tuple[int, str, list[str], list[str]]:
    """(exit status, the summary line, the failing test ids, pytest's lines of them with their messages) of
    ``pytest -x -rfE`` on ``tests`` in the copy."""
    rc, stdout, stderr = call([python, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-o", "addopts=", "-rfE",
                               *tests], work, timeout)
    if rc is None:
        return -9, f"timed out after {timeout} s", failed_ids(stdout), failed_lines(stdout)
    lines = [line for line in stdout.splitlines() if line.strip()]
    return rc, (lines[-1] if lines else stderr.strip()[-300:]), failed_ids(stdout), failed_lines(stdout)


def call(cmd: list[str], work: Path, timeout: int) -> tuple[int | None, str, str]:
    """(exit status or None when it ran past ``timeout``, stdout, stderr) of ``cmd`` in the copy; past the timeout its
    whole process group is ended (a multi-process test's launches with it)."""
    proc = subprocess.Popen(cmd, cwd=work, env=environment(work), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        return proc.returncode, stdout, stderr
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        return None, stdout, stderr


def failed_lines(stdout: str) -> list[str]:
    """pytest's short summary lines of failures ("FAILED id - message", "ERROR id - message")."""
    return [line for line in stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]


def failed_ids(stdout: str) -> list[str]:
    """The test ids of pytest's short summary."""
    return [line.split(" ", 1)[1].split(" - ")[0].strip() for line in failed_lines(stdout)]


def status_of(rc: int, ids: list[str]) -> str:
    if rc == 1 or (rc == 2 and ids):  # 2 with ids: an error while collecting, caused by the fault
        return "caught"
    return "MISSED" if rc == 0 else f"rc={rc}"


MULTI_PROCESS = ("test_sharded.py", "test_context_parallel.py", "test_train_distributed.py")


def cost(fault) -> int:
    """0: tests of seconds; 1: a learning run (a minute or two); 2: one multi-process test (minutes); 3: a whole file
    of them (when nothing before it fails: tens of minutes)."""
    tests = " ".join(fault[4])
    if any(t.endswith(MULTI_PROCESS) for t in fault[4]):
        return 3
    return 2 if any(m in tests for m in MULTI_PROCESS) else 1 if "test_learning.py" in tests else 0


def run(args) -> None:
    tree, work, out = Path(args.tree).resolve(), Path(args.work), Path(args.out)
    chosen = [fault for fault in FAULTS if (not args.names or any(n in fault[1] for n in args.names))
              and (not args.classes or fault[0] in args.classes)]
    chosen.sort(key=cost)  # the cheap ones first: the learning tests, then the multi-process ones, last
    results = json.loads(out.read_text()) if args.append and out.is_file() else []
    by_name = {r["fault"]: r for r in results if "fault" in r}
    meta = next((r["meta"] for r in results if "meta" in r), {})
    meta.update(tree=str(tree), python=args.python, work=str(work))
    meta.setdefault("runs", []).append({"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                                        "faults": [fault[1] for fault in chosen]})
    confirmed = meta.setdefault("confirm", {})  # test id -> "passed" / "FAILED" on the unmodified tree
    print(f"{len(chosen)} faults on {tree} with {args.python} in {work}", flush=True)

    def save():
        order = {fault[1]: i for i, fault in enumerate(FAULTS)}
        rows = sorted(by_name.values(), key=lambda r: order.get(r["fault"], len(order)))
        out.write_text(json.dumps([{"meta": meta}] + rows, indent=1) + "\n")

    for cls, name, f, edits, tests in chosen:
        copy_tree(tree, work)
        row = {"fault": name, "class": cls, "file": f, "tests": tests}
        if not apply(work, f, edits):
            row["status"] = "NOT APPLIED"
        elif (where := resolves_inside(args.python, work, f)) is not None:
            row["status"] = f"NOT IN EFFECT: {f} imports from {where}"
        else:
            t = time.time()
            rc, summary, ids, lines = pytest(args.python, work, tests, args.timeout)
            row.update(status=status_of(rc, ids), rc=rc, caught_by=ids, summary=summary, s=round(time.time() - t),
                       message=[line[:400] for line in lines])
        by_name[name] = row
        print(f"{name}: {row['status']} {row.get('summary', '')} {row.get('s', '')} s", *row.get("message", [])[:1],
              flush=True)
        save()
    if args.confirm:  # the catching tests (of the faults run now, not yet confirmed) must pass without a fault
        now = {fault[1] for fault in chosen}
        ids = sorted({r["caught_by"][0] for r in by_name.values() if r["fault"] in now and r.get("status") == "caught"
                      and r.get("caught_by") and r["caught_by"][0] not in confirmed})
        if ids:
            copy_tree(tree, work)
            rc, stdout, _ = call([args.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-rfE",
                                  *ids], work, args.timeout)
            failing = failed_ids(stdout) if rc is not None else ids
            summary = ([line for line in stdout.splitlines() if line.strip()] or [""])[-1] if rc is not None else "timed out"
            confirmed.update({i: "FAILED" if i in failing else "passed" for i in ids})
            print("confirm (the catching tests on the unmodified tree):", summary, "failing:", failing, flush=True)
    meta["runs"][-1]["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    save()


def check(tree: Path) -> int:
    """Whether every fault's texts are in ``tree`` (each once or more); prints the ones that are not."""
    bad = 0
    for cls, name, f, edits, _ in FAULTS:
        p = tree / f
        s = p.read_text() if p.is_file() else ""
        counts = [s.count(old) for old, _ in edits]
        for old, new in edits:
            s = s.replace(old, new)
        try:
            compile(s, f, "exec")
            ok = all(counts)
        except SyntaxError as e:
            ok, counts = False, f"{counts}, a syntax error: {e}"
        bad += not ok
        print(f"{'ok ' if ok else 'NOT APPLIED'} {cls:11s} {name}  ({f}: {counts})")
    print(f"{len(FAULTS) - bad} of {len(FAULTS)} faults apply to {tree}")
    return 1 if bad else 0


def table(before: Path, after: Path) -> str:
    """A markdown table: fault, file, the test that caught it (before / after), before, after."""
    def rows(path):
        data = json.loads(path.read_text()) if path.is_file() else []
        confirm = next((r["meta"].get("confirm", {}) for r in data if "meta" in r), {})
        for r in data:  # a catching test that fails without the fault too is no evidence: marked
            if r.get("caught_by") and confirm.get(r["caught_by"][0]) == "FAILED":
                r["status"] += " (its test fails without the fault too)"
        return {r["fault"]: r for r in data if "fault" in r}

    b, a = rows(before), rows(after)
    out = ["| fault | class | file | caught by (before) | caught by (after) | before | after |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for cls, name, f, _, _ in sorted(FAULTS, key=lambda fault: CLASSES.index(fault[0])):  # by class, stable
        rb, ra = b.get(name, {}), a.get(name, {})
        first = lambda r: f"`{r['caught_by'][0]}`" if r.get("caught_by") else ""  # noqa: E731
        out.append(f"| {name} | {cls} | {f} | {first(rb)} | "
                   f"{first(ra) if first(ra) != first(rb) else 'the same' if first(ra) else ''} | "
                   f"{rb.get('status', 'not run')} | {ra.get('status', 'not run')} |")
    def counts(rs):
        out = {s: sum(r.get("status") == s for r in rs.values()) for s in ("caught", "MISSED")}
        return {**out, "other": len(rs) - sum(out.values()), "not run": len(FAULTS) - len(rs)}

    out.append("")
    out.append(f"{len(FAULTS)} faults; before: {counts(b)}; after: {counts(a)}")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", nargs="?", help="the results file (JSON)")
    p.add_argument("names", nargs="*", help="only the faults whose name contains one of these")
    p.add_argument("--tree", default=str(SRC), help="the tree to inject into (default: this checkout)")
    p.add_argument("--work", default="/tmp/injected", help="the scratch copy (default /tmp/injected)")
    p.add_argument("--python", default=sys.executable, help="the interpreter that runs pytest (default: this one)")
    p.add_argument("--class", dest="classes", action="append", choices=CLASSES, help="only this class (repeatable)")
    p.add_argument("--append", action="store_true", help="keep OUT's results of the faults not run now")
    p.add_argument("--no-confirm", dest="confirm", action="store_false", help="skip the catching tests' clean run")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per fault's pytest (default 1800)")
    p.add_argument("--check", action="store_true", help="only check that every fault applies to --tree")
    p.add_argument("--list", action="store_true", help="list the faults by class, and how the wiring ones are counted")
    p.add_argument("--table", nargs=2, metavar=("BEFORE", "AFTER"), help="print the markdown table of two results")
    args = p.parse_intermixed_args()
    if args.table:
        print(table(Path(args.table[0]), Path(args.table[1])))
        return 0
    if args.list:
        for cls in CLASSES:
            names = [fault[1] for fault in FAULTS if fault[0] == cls]
            print(f"{cls} ({len(names)}):\n  " + "\n  ".join(names))
        print(WIRING_COUNT)
        return 0
    if args.check:
        return check(Path(args.tree).resolve())
    if not args.out:
        p.error("OUT.json is needed (or --check, --list, --table)")
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
