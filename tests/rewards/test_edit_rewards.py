"""The rewards that see an edit's source: preservation (pixels kept outside the edit) and the VLM edit judge (source,
result and instruction, against the fake chat server of test_vlm.py)."""

import json

import pytest
import torch
from PIL import Image

from flowgrpo.conditions import KEY
from rewards import load_reward
from test_vlm import API_KEY, FakeJudge, judge_url  # noqa: F401  (the fake server fixture)

torch.set_num_threads(1)


def test_preservation_scores_what_survives_outside_the_edit(tmp_path):
    reward = load_reward("preservation")
    source = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    quarter = source.clone()
    quarter[:, :, :16, :16] = torch.tensor([1.0, 0.0, 0.0]).view(1, 3, 1, 1)  # a local edit
    everything = 1 - source  # repainted whole
    results = torch.cat([source, quarter, everything])
    conditions = source.unsqueeze(1).expand(3, 1, 3, 32, 32)
    out = reward(results, ["make the corner red"] * 3, None, conditions=conditions)
    assert out.scores[0] == pytest.approx(1.0, abs=1e-6)
    assert out.scores[1] > 0.9 > 0.2 > out.scores[2]
    # a mask says exactly where the edit may change the image: outside it, the repainted quarter costs nothing,
    # but a change outside the mask does
    Image.fromarray((torch.zeros(32, 32).index_fill_(0, torch.arange(16), 0)
                     .masked_fill(torch.zeros(32, 32, dtype=torch.bool).index_fill_(0, torch.arange(16), True)
                                  & torch.zeros(32, 32, dtype=torch.bool).index_fill_(1, torch.arange(16), True), 1)
                     * 255).byte().numpy()).save(tmp_path / "mask.png")
    meta = [{"mask": str(tmp_path / "mask.png")}] * 2
    shifted = quarter.clone()
    shifted[:, :, 24:, 24:] = 0.0
    masked = reward(torch.cat([quarter, shifted]), ["make the corner red"] * 2, meta, conditions=conditions[:2])
    assert masked.scores[0] == pytest.approx(1.0, abs=1e-6) and masked.scores[1] < 0.95
    with pytest.raises(ValueError, match="judges a result against its source image and got none"):
        reward(results, ["x"] * 3)


def test_a_jsonl_mask_is_checked_and_kept(tmp_path):
    from flowgrpo.data import read_prompts

    Image.new("RGB", (8, 8)).save(tmp_path / "src.png")
    Image.new("L", (8, 8), 255).save(tmp_path / "m.png")
    (tmp_path / "set.jsonl").write_text(json.dumps({"prompt": "p", "image": "src.png", "mask": "m.png"}) + "\n")
    _, metadata = read_prompts(str(tmp_path / "set.jsonl"))
    assert metadata[0][KEY] == [str(tmp_path / "src.png")] and metadata[0]["mask"] == str(tmp_path / "m.png")


def test_the_vlm_edit_judge_sees_source_result_and_instruction(judge_url):  # noqa: F811
    FakeJudge.requests.clear()
    judge = load_reward("vlm_edit_judge", base_url=judge_url, model="fake-judge", api_key=API_KEY, image_size=24)
    results = torch.stack([torch.full((3, 16, 16), v) for v in (0.0, 1.0)])
    sources = torch.full((2, 1, 3, 16, 16), 0.5)
    out = judge(results, ["make it red", "make it blue"], None, conditions=sources)
    assert len(FakeJudge.requests) == 2
    for text, sizes in FakeJudge.requests:
        assert text.startswith("Image 1 is a source image") and "Instruction: make it" in text
        assert sizes == [(24, 24), (24, 24)]  # the source first, then the result
    assert out.info["raw"] == ["Final Answer: Image 1", "Final Answer: Image 2"]  # the fake compares source and result
    FakeJudge.requests.clear()
    pairwise = load_reward("vlm_edit_judge", base_url=judge_url, model="fake-judge", api_key=API_KEY, mode="pairwise",
                           group_size=2, image_size=24)
    pairwise(results, ["make it red"] * 2, None, conditions=sources)
    assert [len(sizes) for _, sizes in FakeJudge.requests] == [3]  # source, result A, result B


def test_a_reward_that_sees_the_source_scores_the_same_served_remotely():
    """The remote protocol carries the condition images: the toy edit scorer hosted by a RewardServer gives the local
    scores (ground truth 1, a copy of the source 0), and says in its health that it judges edits."""
    import numpy as np

    from rewards.remote import RemoteReward, RewardServer
    from rewards.toy.edit_scorer import ToyEditScorer
    from worlds.toy import edits

    items = edits.eval_edits()[::32][:4]

    def pixels(images):
        return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255

    targets = pixels([edits.render_target(p, 32) for p in items])
    sources = pixels([edits.render_source(p, 32) for p in items])
    results = torch.cat([targets, sources])
    texts, meta = [p.text for p in items] * 2, [p.to_dict() for p in items] * 2
    conditions = torch.cat([sources, sources]).unsqueeze(1)
    local = ToyEditScorer()(results, texts, meta, conditions=conditions)
    with RewardServer(ToyEditScorer()) as server:
        remote = RemoteReward(server.url)
        assert remote.sees_condition
        served = remote(results, texts, meta, conditions=conditions)
    assert torch.equal(served.scores, local.scores) and local.scores.tolist() == [1.0] * 4 + [0.0] * 4


def test_clip_image_similarity_is_flow_grpos_edit_scorer_and_missing_weights_are_one_line(tmp_path, monkeypatch):
    """The cosine of the unit CLIP image embeddings of result and source, computed as Flow-GRPO's
    clip_scorer.image_similarity computes it (torchvision Resize + CenterCrop + Normalize of the float images, from the
    processor's settings; get_image_features); a result equal to its source scores 1. Weights not in the local cache
    while offline: one line naming the download."""
    import torchvision.transforms as T
    from huggingface_hub import constants
    from transformers import CLIPImageProcessor, CLIPModel

    from rewards.tiny import tiny_clip_folder

    folder = tiny_clip_folder(tmp_path / "clip")
    reward = load_reward("clip_image_similarity", pretrained=str(folder))
    g = torch.Generator().manual_seed(0)
    results, sources = torch.rand(3, 3, 40, 48, generator=g), torch.rand(3, 1, 3, 40, 48, generator=g)
    scores = reward(results, ["x"] * 3, None, conditions=sources).scores
    model, processor = CLIPModel.from_pretrained(folder).eval(), CLIPImageProcessor.from_pretrained(folder)
    settings = processor.to_dict()
    size = settings["size"]["shortest_edge"] if "shortest_edge" in settings["size"] else tuple(settings["size"].values())
    crop = settings["crop_size"]
    transform = T.Compose([T.Resize(size), T.CenterCrop((crop["height"], crop["width"])),
                           T.Normalize(processor.image_mean, processor.image_std)])
    with torch.no_grad():
        a, b = (model.get_image_features(pixel_values=transform(x)) for x in (results, sources[:, 0]))
    a, b = (getattr(x, "pooler_output", x) for x in (a, b))
    expected = torch.diagonal((a / a.norm(dim=-1, keepdim=True)) @ (b / b.norm(dim=-1, keepdim=True)).T)
    torch.testing.assert_close(scores, expected.float(), rtol=0, atol=1e-5)
    same = reward(results, ["x"] * 3, None, conditions=results.unsqueeze(1)).scores
    torch.testing.assert_close(same, torch.ones(3), rtol=0, atol=1e-5)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(OSError) as error:
        load_reward("clip_image_similarity", pretrained="nonexistent-org/no-such-clip")
    assert "\n" not in str(error.value) and "`hf download nonexistent-org/no-such-clip`" in str(error.value)


def test_the_dense_edit_reward_credits_an_edit_done_in_part():
    """toy_edit_dense: the ground truth 1 and a copy of the source 0 on every held-out edit, as toy_edit; a result
    halfway from the source to the target (each changed pixel blended) earns partial credit where toy_edit gives
    none, and more of the edit earns more."""
    import numpy as np

    from worlds.toy import edits

    items = edits.eval_edits()[::4]
    pixels = lambda images: torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255  # noqa: E731
    target = pixels([edits.render_target(p, 32) for p in items])
    source = pixels([edits.render_source(p, 32) for p in items])
    texts, meta, conditions = [p.text for p in items], [p.to_dict() for p in items], source.unsqueeze(1)
    dense, exact = load_reward("toy_edit_dense"), load_reward("toy_edit")
    means = [float(dense(source + w * (target - source), texts, meta, conditions=conditions).scores.mean())
             for w in (0.0, 0.4, 0.5, 1.0)]
    assert means[0] == 0.0 and means[-1] == 1.0 and 0.0 < means[1] < means[2] < 1.0, means
    assert float(exact(source + 0.4 * (target - source), texts, meta, conditions=conditions).scores.mean()) < means[1]
