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
