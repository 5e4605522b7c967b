"""Inject one fault at a time into a copy of the tree and run the tests that should catch it (issue 46's power check).

    python benchmarks/inject_faults.py OUT.json [NAME_PART ...]

Each fault of ``FAULTS`` is a plain text replacement in one file; the tree (this checkout, without .git, the venv and
run folders) is copied to /tmp/injected, the replacement made, and ``pytest -x`` run on the named tests. A fault is
"caught" when a test fails. Results: docs/results/one_thing_each.md.
"""
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1]
OUT = Path(sys.argv[1])
W = ["tests/engine/test_wiring.py", "tests/engine/test_update_split.py", "tests/engine/test_tied_and_diverse.py"]
FAM = "tests/engine/test_families.py"
FAULTS = [  # (name, file, text, its replacement, the tests that should catch it)
 # the update loop (flowgrpo/engine/learners/)
 ("loop: step normaliser dropped", "flowgrpo/engine/learners/base.py", "loss = loss / step.normaliser", "loss = loss", W),
 ("loop: zero_grad removed", "flowgrpo/engine/learners/base.py", "                policy.zero_grad()\n", "", W),
 ("loop: contract over every step", "flowgrpo/engine/learners/base.py", "first = epoch == 0 and u == 0", "first = True", W),
 ("loop: one inner epoch only", "flowgrpo/engine/learners/base.py", "for epoch in range(t.inner_epochs):", "for epoch in range(1):", W),
 ("loop: filler's loss not zeroed", "flowgrpo/engine/learners/base.py", "policy.backward(loss * 0.0)", "policy.backward(loss)", W + ["tests/engine/test_sharded.py"]),
 ("transition: 1/U dropped", "flowgrpo/engine/learners/transition.py", "row.coef * U if real", "row.coef if real", W),
 ("transition: filler with weight", "flowgrpo/engine/learners/transition.py", "[row.coef * U if real else 0.0 for row in part]", "[row.coef * U for row in part]", W),
 ("transition: groups not in normaliser", "flowgrpo/engine/learners/transition.py", "1.0 / (counts[row.group] * max(1, total_groups))", "1.0 / counts[row.group]", W),
 ("forward: tied samples trained", "flowgrpo/engine/learners/forward.py", "chosen = {g: [i for i in members if not samples[i].tied]", "chosen = {g: [i for i in members]", W),
 ("forward: K dropped from normaliser", "flowgrpo/engine/learners/forward.py", "rows = sum(len(by_group[g]) for g in chunk) * self.cfg.learner.train_times", "rows = sum(len(by_group[g]) for g in chunk)", W),
 ("awm: / adv_max dropped", "flowgrpo/engine/learners/awm.py", "adv / lc.adv_max", "adv", W),
 # the family adapters: the velocity's time convention, the LoRA save
 ("sd3/wan: timestep sigma not sigma*T", "flowgrpo/models/base.py", "return transformer(hidden_states=x, timestep=self._model_time(sigma),", "return transformer(hidden_states=x, timestep=sigma.to(x.device),", ["tests/models/test_sd3.py", "tests/models/test_wan.py"]),
 ("flux: t not t/1000", "flowgrpo/models/flux.py", "timestep=t.to(self.dtype) / 1000,", "timestep=t.to(self.dtype),", ["tests/models/test_flux.py"]),
 ("flux2: t not t/1000", "flowgrpo/models/flux2.py", "timestep=t.to(self.dtype) / 1000,", "timestep=t.to(self.dtype),", ["tests/models/test_flux2.py"]),
 ("qwen_image: t not t/1000", "flowgrpo/models/qwen_image.py", "timestep=t.to(self.dtype) / 1000,", "timestep=t.to(self.dtype),", ["tests/models/test_qwen_image.py"]),
 ("z_image: t/1000 not (1000-t)/1000", "flowgrpo/models/z_image.py", "timestep = (1000 - t) / 1000", "timestep = t / 1000", ["tests/models/test_z_image.py"]),
 ("flux2: single blocks not LoRA-trained", "flowgrpo/models/flux2.py", 'return [*DEFAULT_LORA_TARGETS, "attn.to_qkv_mlp_proj",', 'return [*DEFAULT_LORA_TARGETS, "attn.to_qkv_mlp_proj"]; [', ["tests/models/test_flux2.py"]),
 ("LoRA save: empty state", "flowgrpo/models/trainable.py", "transformer_lora_layers=get_peft_model_state_dict(network, state_dict=state, adapter_name=ADAPTER_NAME),", "transformer_lora_layers={k: v * 0 for k, v in get_peft_model_state_dict(network, state_dict=state, adapter_name=ADAPTER_NAME).items()},", [FAM + "::test_preset_trains_on_family"]),
]
only = sys.argv[2:]
results = []
for name, f, old, new, tests in FAULTS:
    if only and not any(o in name for o in only):
        continue
    work = Path("/tmp/injected"); shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(SRC, work, ignore=shutil.ignore_patterns(".git", ".venv", ".peers", ".whl", "runs", "__pycache__", "*.egg-info"))
    p = work / f; s = p.read_text()
    if s.count(old) < 1:
        results.append({"fault": name, "status": "NOT APPLIED"}); print(name, "NOT APPLIED", flush=True); continue
    p.write_text(s.replace(old, new))
    t = time.time()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-o", "addopts=-ra", *tests],
                       cwd=work, capture_output=True, text=True, timeout=1800)
    last = [l for l in r.stdout.splitlines() if l.strip()][-1:] 
    status = "caught" if r.returncode == 1 else ("MISSED" if r.returncode == 0 else f"rc={r.returncode}")
    results.append({"fault": name, "file": f, "tests": tests, "status": status, "summary": last, "s": round(time.time() - t)})
    print(name, status, last, round(time.time() - t), flush=True)
    OUT.write_text(json.dumps(results, indent=1))
