"""What a video sample holds in memory (issue 47; docs/scaling.md, "What a video sample holds"): four options that cut
or move what a rollout and an update keep, each checked against the plain path on the tiny SD3 (CFG on, three
encoders):

- ``sampling.chunk``: the rollout's network calls in chunks of samples (with CFG each call is [uncond; cond] of its
  chunk) give the whole level's record, in level-rows / chunk times as many calls;
- ``sampling.latent_storage``: bfloat16 halves the record's bytes and keeps ρ = 1 exactly at inner epoch 0 (the walk
  rounds the trained steps' states, so the stored log-probs are those of the stored states); host trains exactly as
  float32;
- ``train.activation_offload``: the training forward's saved tensors go through torch's save_on_cpu, with the same
  update;
- ``model.offload_text_encoders``: the encoders come to the device for each encoding (the rollout's and the held-out
  evaluation's) and go back to the CPU after, with the same conditioning.

On this CPU-only machine host memory *is* the device's, so host storage, activation offload and encoder offload move
nothing: the tests pin what is requested (where the record is read back, which hooks hold the saved tensors, which
moves each encoder is told) and that the results are unchanged.
"""

import pytest
import torch

from flowgrpo.config import load_config
from flowgrpo.engine.learners import Rollouts
from flowgrpo.engine.trainer import Trainer
from tolerance import assert_close_ulps
from train_fixtures import PLUGIN_REWARD, overrides

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

GROUP, PROMPTS, STEPS, WHOLE = 2, 2, 4, 64  # a level holds PROMPTS·GROUP = 4 samples; WHOLE: more than a level
LATENTS = ("state", "next_state", "leaf_state", "root_state")


def _iteration(model_dir, out, **settings) -> dict:
    """One iteration (rollout, advantages, the update) of a small Flow-GRPO run on the tiny SD3 with
    ``settings``: the trainer, its record, the update's metrics, the weights and last gradients after it, the network's
    calls in the rollout (rows of each) and how many tensors the update saved for backward through the outermost
    saved-tensor hooks, inside the network's forwards and outside them (the likelihood and loss arithmetic)."""
    cfg = load_config("flow_grpo", None, overrides(model_dir, out, **{
        "sampling.plan.group_size": GROUP, "sampling.plan.num_steps": STEPS, "sampling.guidance_scale": 4.5,
        "train.prompts_per_iteration": PROMPTS, "train.iterations": 1, "log.samples_every": 0, "log.save_every": 0,
        "log.gallery": "false", "log.mfu": "false", "sampling.chunk": WHOLE, **settings}), base=PLUGIN_REWARD)
    trainer = Trainer(cfg)
    calls = []
    hook = trainer.model.transformer.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append(int(kwargs["hidden_states"].shape[0])), with_kwargs=True)
    plan = trainer.schedule.plan(0)
    batches = trainer.sample(0, plan)
    hook.remove()
    advantages, _ = trainer.assign_credit(batches, plan)
    # the outermost saved-tensor hooks see every tensor saved for backward unless inner hooks (save_on_cpu, entered
    # inside) take it: counted apart inside the network's forwards and outside them
    inside, saved = [False], {"network": 0, "other": 0}
    network = trainer.model.transformer
    hooks = [network.register_forward_pre_hook(lambda *_: inside.__setitem__(0, True)),
             network.register_forward_hook(lambda *_: inside.__setitem__(0, False))]

    def pack(tensor):
        saved["network" if inside[0] else "other"] += 1
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        metrics = trainer.learner.update(Rollouts(0, plan, batches, advantages))
    for h in hooks:
        h.remove()
    trainer.scoring.close()
    trainer.writer.close()
    params = trainer.policy.params
    return {"trainer": trainer, "record": batches[0].record, "metrics": metrics, "calls": calls, "saved": saved,
            "weights": [p.detach().clone() for p in params], "grads": [p.grad.detach().clone() for p in params]}


@pytest.fixture(scope="module")
def plain(tiny_sd3_dir, tmp_path_factory):
    """The plain path: the whole level in one call per step, float32 latents on the device, nothing offloaded."""
    return _iteration(tiny_sd3_dir, tmp_path_factory.mktemp("plain"))


def _same_update(run, reference, ulps: float = 0):
    """``run``'s update is ``reference``'s: the loss, the gradients and the weights after the step (exactly with
    ulps=0, else within ``ulps`` of each tensor's magnitude)."""
    for key in ("loss", "grad_norm"):
        expected = torch.tensor(reference["metrics"][key])
        assert_close_ulps(torch.tensor(run["metrics"][key]), expected, ulps=ulps, msg=key)
    for name in ("grads", "weights"):
        for a, b in zip(run[name], reference[name]):
            assert_close_ulps(a, b, ulps=ulps, msg=name)


def test_a_chunked_rollout_is_the_whole_level_at_once_in_more_calls(plain, tiny_sd3_dir, tmp_path):
    one = _iteration(tiny_sd3_dir, tmp_path, **{"sampling.chunk": 1})
    assert one["trainer"].cfg.sampling.chunk == 1 and plain["trainer"].cfg.sampling.chunk == WHOLE
    level = PROMPTS * GROUP
    # with CFG every call carries [uncond; cond]: the whole level is one call of 2·4 rows per step, a chunk of one
    # sample a call of 2 rows, level / chunk = 4 times as many
    assert plain["calls"] == [2 * level] * STEPS
    assert one["calls"] == [2] * (level * STEPS)
    a, b = one["record"], plain["record"]
    for name in LATENTS:  # the same draws; the network's rows in another batch: float32 rounding at most
        assert_close_ulps(a.latents(name), b.latents(name), ulps=64, msg=name)
    assert_close_ulps(a.log_prob, b.log_prob, ulps=64, msg="log_prob")
    # the rollout's rows went through the network one by one, the learner's all together: ρ − 1 is float32 rounding
    # (1 ulp seen), as between any two batch compositions
    assert one["metrics"]["max_abs_ratio_minus_1_epoch0"] <= 8 * torch.finfo(torch.float32).eps


def test_bfloat16_latents_halve_the_record_and_keep_the_ratio_one_at_epoch_0(plain, tiny_sd3_dir, tmp_path):
    half = _iteration(tiny_sd3_dir, tmp_path, **{"sampling.latent_storage": "bfloat16"})
    stored, full = half["record"], plain["record"]
    assert all(getattr(stored, name).dtype == torch.bfloat16 for name in LATENTS)
    assert stored.latent_bytes() * 2 == full.latent_bytes() > 0
    # read back as the rollout computed them: float32 on the model's device, exactly the bfloat16 values
    x = stored.latents("state")
    assert x.dtype == torch.float32 and x.device == half["trainer"].model.device
    assert torch.equal(x, stored.state.float())
    # the stored log-probs are those of the rounded states the learner recomputes from: ρ = 1 exactly (rounding only
    # the stored copy of a float32 walk gives |ρ − 1| ≈ 2e-4 here)
    assert half["metrics"]["max_abs_ratio_minus_1_epoch0"] == 0.0
    # the walk rounds only its trained states: the samples stay within bfloat16's rounding of the float32 walk's
    assert_close_ulps(stored.latents("leaf_state"), full.latents("leaf_state"), ulps=4, dtype=torch.bfloat16)


def test_host_latents_train_exactly_like_device_latents(plain, tiny_sd3_dir, tmp_path):
    host = _iteration(tiny_sd3_dir, tmp_path, **{"sampling.latent_storage": "host"})
    record = host["record"]
    assert all(getattr(record, name).device.type == "cpu" for name in LATENTS)
    assert record.latent_device == host["trainer"].model.device and record.latent_dtype == torch.float32
    for name in LATENTS:
        assert torch.equal(record.latents(name), plain["record"].latents(name)), name
    assert torch.equal(record.log_prob, plain["record"].log_prob)
    _same_update(host, plain)


def test_activation_offload_keeps_the_saved_tensors_on_the_host_with_the_same_update(plain, tiny_sd3_dir, tmp_path):
    offloaded = _iteration(tiny_sd3_dir, tmp_path, **{"train.activation_offload": True,
                                                      "model.offload_text_encoders": True})
    policy = offloaded["trainer"].policy
    assert isinstance(policy.saved_activations(), torch.autograd.graph.save_on_cpu)
    assert not isinstance(plain["trainer"].policy.saved_activations(), torch.autograd.graph.save_on_cpu)
    # every tensor the network's forward saved went to save_on_cpu's hooks (none reached the outer ones, which the
    # plain update fills); the likelihood and loss arithmetic outside the network saves as before
    assert plain["saved"]["network"] > 0 and offloaded["saved"]["network"] == 0, (plain["saved"], offloaded["saved"])
    assert offloaded["saved"]["other"] == plain["saved"]["other"] > 0
    _same_update(offloaded, plain, ulps=4)


def test_offloaded_text_encoders_come_for_each_encoding_and_wait_on_the_cpu(tiny_sd3_dir):
    from flowgrpo.evaluate import generate
    from flowgrpo.models import load_model

    config = {"family": "sd3", "pretrained": tiny_sd3_dir, "resolution": 32, "device": "cpu"}
    model, offloaded = load_model(config), load_model({**config, "offload_text_encoders": True})
    encoders = offloaded.text_encoders()
    assert sorted(encoders) == ["text_encoder", "text_encoder_2", "text_encoder_3"]
    assert offloaded.text_encoders_device == torch.device("cpu")  # parked at load
    events = []  # each encoder's moves (through its real .to) and forwards, in order
    for name, module in encoders.items():
        real = module.to

        def moved(*args, _name=name, _real=real, **kwargs):
            events.append(("to", _name, torch.device(args[0])))
            return _real(*args, **kwargs)

        module.to = moved
        module.register_forward_pre_hook(lambda m, args, _name=name: events.append(("forward", _name, None)))
    prompts = ["a red cube", "two cats"]
    cond, expected = offloaded.encode_prompts(prompts), model.encode_prompts(prompts)
    for key in ("prompt_embeds", "pooled_prompt_embeds", "negative_prompt_embeds", "negative_pooled_prompt_embeds"):
        assert torch.equal(getattr(cond, key), getattr(expected, key)), key
    forwards = [i for i, e in enumerate(events) if e[0] == "forward"]
    brought = [i for i, e in enumerate(events) if e[0] == "to" and e[2] == offloaded.device and i < forwards[0]]
    parked = [i for i, e in enumerate(events) if e[0] == "to" and e[2] == torch.device("cpu") and i > forwards[-1]]
    assert len(brought) == len(parked) == 3 and {events[i][1] for i in forwards} == set(encoders)
    assert offloaded.text_encoders_device == torch.device("cpu")
    assert all(p.device.type == "cpu" for module in encoders.values() for p in module.parameters())
    # the held-out evaluation encodes through the same call: the same samples, the encoders parked again after
    events.clear()
    images = generate(offloaded, prompts, steps=2, progress=False)
    assert torch.equal(images, generate(model, prompts, steps=2, progress=False))
    assert [e[2] for e in events if e[0] == "to"][-3:] == [torch.device("cpu")] * 3


def _toy_velocity(x, sigma, cond_index):
    """A velocity of + and × only (each row's output exact whatever the batch), conditioned on its rows."""
    s = sigma.to(x.dtype).view(-1, *([1] * (x.dim() - 1)))
    return x * (0.5 + s * s) - 0.1 * s * x * x + 0.05 * (cond_index.to(x.dtype).view_as(s) + 1)


@pytest.mark.parametrize("plan", [
    dict(num_steps=6, kernel="flow_sde", group_size=3),  # every step trained (Flow-GRPO)
    dict(num_steps=10, group_size=2, window=(2, 3), post_window_ratio=0.4),  # an SDE window between ODE steps
    dict(num_steps=8, kernel="dance_sde", splits=(0, 2, 4), window=(5, 2)),  # a tree (BranchGRPO-Mix)
    dict(num_steps=6, kernel="ode", side_steps=(0, 2, 4), side_children=3, solver="dpmpp_2m"),  # side branches
    dict(num_steps=8, kernel="dance_sde", group_size=4, train_subset_fraction=0.6),  # DanceGRPO's random subset
], ids=["chain", "window", "tree", "side_branches", "subset"])
def test_every_plan_scores_its_bfloat16_record_exactly_and_host_is_float32(plan):
    """The executor's side: whatever trains (a chain, a window, a tree, side branches, a random subset), re-scoring
    the bfloat16 record's stored states gives its stored log-probs bit for bit, and a host record is the float32
    one."""
    from samplers import compose_plan, rollout, score_transitions

    plan = compose_plan(**plan)

    def run(storage):
        return rollout(_toy_velocity, plan, prompt_ids=[3, 5], latent_shape=(2, 3, 2), seed=7, iteration=1,
                       store_mean=True, latent_storage=storage)

    full, half, host = run("float32"), run("bfloat16"), run("host")
    assert half.num_transitions == full.num_transitions > 0
    assert all(getattr(half, name).dtype == torch.bfloat16 for name in LATENTS) and half.mean.dtype == torch.float32
    assert half.latent_bytes() == full.latent_bytes() - (full.latent_bytes() - full.mean.nbytes) // 2
    lp, mean = score_transitions(_toy_velocity, half)
    assert torch.equal(lp, half.log_prob) and torch.equal(mean, half.mean)
    for name in LATENTS + ("mean", "log_prob"):
        assert torch.equal(getattr(host, name), getattr(full, name)), name


def test_the_retired_max_batch_names_sampling_chunk():
    from flowgrpo.config import ConfigError

    with pytest.raises(ConfigError, match=r"^sampling.max_batch is called sampling.chunk now: samples per rollout"):
        load_config(None, None, ["sampling.max_batch=16"])
    assert load_config(None, None, ["sampling.chunk=16"]).sampling.chunk == 16
