"""Which training prompt fills each slot (flowgrpo.data.draw_prompt): uniform passes over the set, or
balanced over a metadata key (train.balance_by), as pure functions of the slot's position."""

from collections import Counter

import pytest

from flowgrpo.data import PromptFileError, draw_prompt, read_prompts, strata


def test_uniform_draws_visit_every_prompt_once_per_pass():
    count = 37
    for epoch in range(3):
        drawn = [draw_prompt(epoch * count + i, count, seed=5) for i in range(count)]
        assert sorted(drawn) == list(range(count))
    assert [draw_prompt(i, count, 5) for i in range(count)] != [draw_prompt(i, count, 6) for i in range(count)]


def test_balanced_draws_give_every_task_the_same_share_of_the_toy_train_set():
    prompts, metadata = read_prompts("toy-train")
    by_task = strata(metadata, "task")
    groups = list(by_task.values())
    sizes = {task: len(g) for task, g in by_task.items()}
    assert all(metadata[i]["task"] == task for task, g in by_task.items() for i in g)
    assert sizes["position"] == 744 and sizes["single_object"] == 2  # uniform draws give position 372x the share
    drawn = [draw_prompt(i, len(prompts), 0, groups) for i in range(6 * 50)]
    tasks = [metadata[i]["task"] for i in drawn]
    assert Counter(tasks) == {task: 50 for task in sizes}
    for start in range(0, len(tasks), 6):  # each run of 6 slots holds one prompt of every task
        assert len(set(tasks[start : start + 6])) == 6
    # a small group's prompts each come once per pass over the group
    single = [i for i in drawn if metadata[i]["task"] == "single_object"]
    assert all(sorted(single[k : k + 2]) == sorted(by_task["single_object"]) for k in range(0, 50, 2))
    # a pure function of the position: the same prompt whatever the batch size or the process asks
    assert [draw_prompt(i, len(prompts), 0, groups) for i in (7, 200, 3)] == [drawn[7], drawn[200], drawn[3]]


def test_balancing_needs_the_key_on_every_prompt_or_on_none():
    assert strata([{}, {"other": 1}], "task") is None  # e.g. a .txt file: drawn uniformly
    with pytest.raises(PromptFileError, match=r"prompt 1 of 'mine.jsonl' has no metadata 'task' while others do.*balance_by=''"):
        strata([{"task": "a"}, {}], "task", "mine.jsonl")


def test_batch_draws_are_each_batchs_own_random_choice_and_a_repeated_prompt_is_one_group():
    """train.prompt_draw=batch (the Flow-GRPO-family codes' sampler): each rollout batch holds distinct prompts drawn
    afresh, so a prompt comes back before the pass is over and, drawn into two batches of an iteration, its samples
    are one group; pass draws keep every slot its own group."""
    from types import SimpleNamespace

    from flowgrpo.data import draw_batch_prompts
    from flowgrpo.engine.rollout import PromptDraws

    count, size = 10, 4
    batches = [draw_batch_prompts(it, b, size, count, seed=3) for it in range(6) for b in range(2)]
    assert all(len(set(b)) == size and all(0 <= i < count for i in b) for b in batches)
    assert draw_batch_prompts(2, 1, size, count, 3) == batches[5]  # a pure function of (seed, iteration, batch)
    seen, repeated_early = set(), False  # once per pass would show all 10 before any prompt comes back
    for b in batches:
        repeated_early |= bool(seen & set(b)) and len(seen) < count
        seen |= set(b)
    assert repeated_early
    with pytest.raises(PromptFileError, match=r"draws 11 distinct prompts a rollout batch from a set of 10"):
        draw_batch_prompts(0, 0, 11, count, 0)

    prompts = [f"p{i}" for i in range(3)]
    train = SimpleNamespace(prompts_per_iteration=6, seed=0, prompt_draw="batch")
    draws = PromptDraws(prompts, [{}] * 3, None, train, batches=2, rank=0, world=1)
    slots = draws.iteration_slots(0)
    keys = [draws.group_keys(s, [draws.dataset_index(0, k) for k in s]) for s in slots]
    assert sorted(keys[0]) == sorted(keys[1]) == [0, 1, 2]  # both batches hold all 3 prompts: 3 groups, not 6
    assert keys == [[draws.dataset_index(0, s) for s in batch] for batch in slots]
    train.prompt_draw = "pass"
    draws = PromptDraws(prompts * 2, [{}] * 6, None, train, batches=2, rank=0, world=1)
    assert [draws.group_keys(s, [draws.dataset_index(0, k) for k in s]) for s in draws.iteration_slots(0)] == \
        [[0, 1, 2], [3, 4, 5]]


def test_the_official_training_sets_are_checked_by_their_git_blob_id_shipped_or_fetched(tmp_path, monkeypatch):
    import subprocess

    from flowgrpo import prompt_sets
    from flowgrpo.prompt_sets import TRAINING_PROMPT_SETS, PromptSetError, git_blob_id, prompt_set_file

    shipped = prompt_set_file("pickscore-train", fetch=False)
    assert git_blob_id(shipped.read_bytes()) == TRAINING_PROMPT_SETS["pickscore-train"].blob
    prompts, _ = read_prompts("pickscore-train")
    assert len(prompts) == 25432
    assert subprocess.run(["git", "hash-object", str(shipped)], capture_output=True, text=True).stdout.strip() == \
        TRAINING_PROMPT_SETS["pickscore-train"].blob  # the id is git's own

    # a fetched set: served by a mirror (file://), checked, cached; wrong bytes are refused and nothing is kept
    monkeypatch.setenv("FLOWGRPO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FLOWGRPO_PROMPTS_URL", (tmp_path / "mirror").as_uri() + "/{repository}/{commit}/{path}")
    official = b"a red sign that says hello\na cat\n"
    s = TRAINING_PROMPT_SETS["ocr-train"]
    monkeypatch.setitem(TRAINING_PROMPT_SETS, "ocr-train", prompt_sets.PromptSet(
        s.name, s.repository, s.commit, s.path, git_blob_id(official), s.licence, s.what))
    served = tmp_path / "mirror" / s.repository / s.commit / s.path
    served.parent.mkdir(parents=True)
    served.write_bytes(b"a tampered file\n")
    with pytest.raises(PromptSetError, match="whose git blob id is .* not the official file's .*nothing was kept"):
        read_prompts("ocr-train")
    assert not (tmp_path / "cache" / "prompts" / "ocr-train.txt").exists()
    served.write_bytes(official)
    assert read_prompts("ocr-train")[0] == ["a red sign that says hello", "a cat"]
    served.unlink()  # read from the cache now
    assert read_prompts("ocr-train")[0] == ["a red sign that says hello", "a cat"]
    with pytest.raises(PromptSetError, match=r"could not be fetched from .*flowgrpo prompts fetch geneval-train"):
        read_prompts("geneval-train")


def test_a_real_model_on_the_tiny_worlds_prompts_is_warned_and_a_tiny_one_is_not():
    from types import SimpleNamespace

    import torch

    from flowgrpo.data import toy_prompts_warning

    real = SimpleNamespace(transformer=torch.nn.Linear(12_000, 12_000, device="meta"))  # 144M parameters, no memory
    tiny = SimpleNamespace(transformer=torch.nn.Linear(100, 100))
    assert "prompts='toy-train' is the tiny world's prompt set" in toy_prompts_warning("toy-train", real)
    assert "geneval-train" in toy_prompts_warning("toy-train", real)
    assert toy_prompts_warning("toy-train", tiny) == ""
    assert toy_prompts_warning("pickscore-train", real) == ""


def test_a_prompt_drawn_into_two_batches_of_an_iteration_is_one_group_in_training(tmp_path):
    """End to end on the analytic world (8 prompts): prompt_draw=batch with two batches of 8 puts every prompt in
    both, and the trainer's advantages z-score each prompt's 2 x group samples together (their mean is 0 over both
    batches, not within each); prompt_draw=pass keeps every slot its own group (mean 0 within each batch)."""
    import torch

    from train_fixtures import analytic_rollout

    def prompt_means(draw):
        trainer, plan, batches, records = analytic_rollout(
            tmp_path / draw, "flow_grpo", f"train.prompt_draw={draw}", "train.prompts_per_iteration=16",
            "sampling.batches_per_iteration=2", "prompts=analytic-train")
        adv, _ = trainer.assign_credit(batches, plan)
        per_batch = [{} for _ in batches]
        for b, (batch, rec, leaves) in enumerate(zip(batches, records, adv.leaves)):
            for p, a in zip(rec.leaf_prompt.tolist(), leaves.tolist()):
                per_batch[b].setdefault(batch.keys[p], []).append(a)
        return per_batch

    merged = prompt_means("batch")
    assert sorted(merged[0]) == sorted(merged[1]) == list(range(8))  # each batch drew all 8 prompts
    together = [torch.tensor(merged[0][k] + merged[1][k]).mean() for k in range(8)]
    alone = [torch.tensor(merged[b][k]).mean().abs() for b in range(2) for k in range(8)]
    assert max(abs(float(m)) for m in together) < 1e-5 and max(float(a) for a in alone) > 1e-2
    apart = prompt_means("pass")
    assert max(abs(float(torch.tensor(v).mean())) for batch in apart for v in batch.values()) < 1e-5
