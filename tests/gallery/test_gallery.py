"""The gallery: building a site from a run directory, the local server and its flags, and the page in
a real headless chromium (console errors, counts, filters, sorting, video, flags, escaping)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from browser_helpers import severe_console_entries, start_browser, stop_browser, wait_for, wait_render

from gallery import build_site
from gallery.serve import GalleryServer
from gallery.synthetic import prompt_for, write_run

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=1</script>'


def _shard(site: Path, step: str) -> dict:
    text = (site / "data" / "steps" / f"{step}.js").read_text()
    return json.loads(text[text.index("{"): text.rindex("}") + 1])


def _index(site: Path) -> dict:
    text = (site / "data" / "index.js").read_text()
    return json.loads(text[text.index("{"): text.rindex("}") + 1])


# ---------------------------------------------------------------- build (no browser)


def test_build_lists_every_step_sample_and_reward(tmp_path):
    run = write_run(tmp_path / "run", steps=3, prompts_per_step=5, per_prompt=4, eval_step=True)
    site = build_site(run).parent
    assert site == run / "gallery"
    index = _index(site)
    assert [(s["name"], s["kind"], s["samples"], s["groups"]) for s in index["steps"]] == [
        ("eval_0", "eval", 20, 5), ("step_10", "train", 20, 5), ("step_20", "train", 20, 5), ("step_30", "train", 20, 5)]
    assert index["num_samples"] == 80 and index["reward_names"] == ["toy", "aesthetic"]
    rows = [json.loads(line) for line in (run / "samples" / "step_20" / "manifest.jsonl").read_text().splitlines()]
    assert index["steps"][2]["reward_means"]["toy"] == pytest.approx(sum(r["rewards"]["toy"] for r in rows) / len(rows))
    shard = _shard(site, "step_20")
    first = shard["groups"][0]["samples"][0]
    assert first["r"] == [rows[0]["rewards"]["toy"], rows[0]["rewards"]["aesthetic"]] and first["adv"] == rows[0]["advantage"]
    assert (site / first["src"]).read_bytes() == (run / "samples" / "step_20" / rows[0]["file"]).read_bytes()
    assert first["thumb"] == first["src"] and (first["w"], first["h"]) == (64, 64)  # 64x64: shown as is


def test_build_is_incremental_and_picks_up_new_steps(tmp_path):
    run = write_run(tmp_path / "run", steps=2, prompts_per_step=2, per_prompt=2, image_size=300)
    site = build_site(run).parent
    thumbs = sorted((site / "thumbs").rglob("*.jpg"))
    assert len(thumbs) == 8  # 300 px images: thumbnails of at most 256 px
    from PIL import Image

    assert max(Image.open(thumbs[0]).size) == 256
    stamps = {p: p.stat().st_mtime_ns for p in thumbs + list((site / "data" / "steps").glob("*.js"))}
    time.sleep(0.01)
    build_site(run)
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps  # nothing re-read, nothing redrawn
    write_run(tmp_path / "more", steps=3, prompts_per_step=2, per_prompt=2, image_size=300)
    os.rename(tmp_path / "more" / "samples" / "step_30", run / "samples" / "step_30")
    index = _index(build_site(run).parent)
    assert [s["name"] for s in index["steps"]] == ["step_10", "step_20", "step_30"]
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps


def test_build_copies_media_across_file_systems(tmp_path):
    run = write_run(tmp_path / "run", steps=1, prompts_per_step=1, per_prompt=2)
    if not os.path.isdir("/dev/shm") or os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another file system than the run")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as out:
        build_site(run, out)
        copies = sorted(Path(out, "media", "step_10").iterdir())
        source = run / "samples" / "step_10" / copies[0].name
        assert len(copies) == 2 and copies[0].read_bytes() == source.read_bytes()
        assert copies[0].stat().st_ino != source.stat().st_ino
        stamp = copies[0].stat().st_mtime_ns
        build_site(run, out, force=True)  # every step re-read: matching copies are kept
        assert copies[0].stat().st_mtime_ns == stamp


def test_build_reads_the_run_writer_format(tmp_path):
    """Lines as flowgrpo.run.run_dir.RunWriter wrote them before it recorded group_size, group_rewards and
    noise_seed (NaN reward and advantage as null): still read, the group's size unknown, the run seed labelled."""
    run = tmp_path / "runs" / "tiny"
    folder = run / "samples" / "step_10"
    folder.mkdir(parents=True)
    from PIL import Image

    lines = []
    for slot, node, reward in [(3, 12, 0.5), (3, 13, None), (7, 12, 1.0)]:
        name = f"s{slot:04d}_n{node:04d}.png"
        Image.new("RGB", (64, 64), (slot * 20, 0, 0)).save(folder / name)
        lines.append(json.dumps({
            "prompt": "a photo of a red circle", "metadata": {"task": "colors", "clauses": [{"shape": "circle"}]},
            "seed": 0, "iteration": 10, "prompt_slot": slot, "group": 0, "node": node, "parent": node - 4,
            "rewards": {"toy": reward}, "advantage": None if reward is None else reward - 0.5, "file": name}))
    (folder / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    (run / "metrics.jsonl").write_text(json.dumps({"iteration": 10, "reward/toy_mean": 0.75, "kl_ref": None}) + "\n")
    (run / "config.yaml").write_text("run_name: tiny\n")
    site = build_site(run).parent
    index = _index(site)
    assert index["steps"][0]["reward_means"] == {"toy": 0.75} and index["metric_keys"] == ["reward/toy_mean"]
    groups = _shard(site, "step_10")["groups"]
    assert [(g["slot"], g["task"], len(g["samples"])) for g in groups] == [(3, "colors", 2), (7, "colors", 1)]
    assert groups[0]["samples"][1]["r"] == [None] and groups[0]["samples"][1]["adv"] is None
    assert groups[0]["size"] is None and groups[0]["stats"] == [None] and groups[0]["run_seed"] == "0"
    assert groups[0]["samples"][0]["seed"] is None  # no per-sample noise seed recorded: none shown as one


def _rollout_batch(shared: bool):
    """A real rollout record (2 prompts at slots 5 and 9, chains of 8 per prompt) as the trainer's Batch holds it."""
    from types import SimpleNamespace

    import samplers

    plan = samplers.compose_plan(3, kernel="flow_sde", group_size=8, initial_noise="shared" if shared else "independent")
    rec = samplers.rollout(lambda x, sigma, index: -x, plan, prompt_ids=[5, 9], latent_shape=(3, 4, 4), seed=7,
                           iteration=3)
    images = (rec.leaf_state * 0.2 + 0.5).clamp(0, 1)
    return SimpleNamespace(record=rec, slots=[5, 9], texts=["a red circle", "two squares"],
                           metadata=[{"task": "colors"}, {"task": "counting"}], images=images)


@pytest.mark.parametrize("shared", [False, True])
def test_the_run_writer_records_group_size_group_statistics_and_noise_seeds(tmp_path, shared):
    """A group of 8 with 4 saved: every line says the group has 8 and gives the reward mean and std over all 8
    (what the advantages used), and each sample's noise seed regenerates the x_T it was sampled from."""
    import torch

    from flowgrpo.run.run_dir import RunWriter

    batch = _rollout_batch(shared)
    rec = batch.record
    rewards = torch.tensor([0.1, 0.9, 0.2, 0.8, 0.3, 0.3, 0.95, 0.05, 0.5, float("nan"), 0.4, 0.4, 0.6, 0.7, 1.0, 0.0])
    writer = RunWriter(tmp_path / "run")
    writer.write_samples(4, [batch], rewards[:, None], rewards - 0.5, ["toy"], per_prompt=4, seed=7,
                         sampled_iteration=3, shared_noise=shared)
    rows = [json.loads(line) for line in (tmp_path / "run" / "samples" / "step_4" / "manifest.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and all(r["group_size"] == 8 for r in rows)
    for g, leaves in ((0, rewards[:8]), (1, rewards[8:])):
        valid = leaves[~leaves.isnan()].double()
        in_group = [r for r in rows if r["group"] == g]
        recorded = in_group[0]["group_rewards"]["toy"]
        assert len(in_group) == 4 and all(r["group_rewards"]["toy"] == recorded for r in in_group)
        assert recorded["n"] == valid.numel() == (8 if g == 0 else 7)  # NaN left out, as the advantages leave it
        assert recorded["mean"] == pytest.approx(float(valid.mean()), rel=1e-12)
        assert recorded["std"] == pytest.approx(float(valid.std(unbiased=False)), rel=1e-12)
        saved = torch.tensor([r["rewards"]["toy"] for r in in_group if r["rewards"]["toy"] is not None])
        assert abs(float(saved.mean()) - recorded["mean"]) > 0.01  # the saved 4 alone would have said otherwise
    for r in rows:  # the recorded seed draws exactly the sample's starting noise
        leaf = next(i for i in range(rec.num_leaves) if int(rec.leaf_node[i]) == r["node"]
                    and batch.slots[int(rec.leaf_prompt[i])] == r["prompt_slot"])
        drawn = torch.randn((3, 4, 4), generator=torch.Generator().manual_seed(r["noise_seed"]))
        assert torch.equal(drawn, rec.root_state[rec.leaf_root[leaf]].float()), r["file"]
    seeds = [r["noise_seed"] for r in rows]
    assert len(set(seeds)) == (2 if shared else 8)  # one x_T per prompt when shared, else one per sample


def test_eval_samples_record_each_sample_noise_seed(tmp_path):
    """Evaluation cards used to all say the base seed; each records the seed of its own starting noise."""
    import torch

    from samplers import eval_noise as initial_noise
    from flowgrpo.run.run_dir import RunWriter

    media = torch.rand(3, 3, 8, 8)
    RunWriter(tmp_path / "run").write_eval_samples(0, media, ["a", "b", "c"], None, torch.tensor([0.1, 0.2, 0.3]),
                                                   "toy", seed=12345)
    rows = [json.loads(line) for line in (tmp_path / "run" / "samples" / "eval_0" / "manifest.jsonl").read_text().splitlines()]
    assert [r["seed"] for r in rows] == [12345] * 3 and len({r["noise_seed"] for r in rows}) == 3
    for i, r in enumerate(rows):
        expected = initial_noise((4, 2, 2), 12345, [i])[0]
        assert torch.equal(torch.randn((4, 2, 2), generator=torch.Generator().manual_seed(r["noise_seed"])), expected)
    site = build_site(tmp_path / "run").parent
    shown = [s["seed"] for g in _shard(site, "eval_0")["groups"] for s in g["samples"]]
    assert shown == [str(r["noise_seed"]) for r in rows]


def test_build_carries_group_size_statistics_and_exact_seeds(tmp_path):
    run = write_run(tmp_path / "run", steps=1, prompts_per_step=2, per_prompt=4, group_size=8, eval_step=True)
    manifest = run / "samples" / "step_10" / "manifest.jsonl"
    rows = [json.loads(line) for line in manifest.read_text().splitlines()]
    rows[0]["noise_seed"] = 2**62 + 5  # 63-bit generator seeds do not fit a JavaScript number: kept as text
    manifest.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    site = build_site(run).parent
    groups = _shard(site, "step_10")["groups"]
    assert [(g["size"], len(g["samples"])) for g in groups] == [(8, 4), (8, 4)]
    whole = rows[0]["group_rewards"]
    assert groups[0]["stats"] == [[whole["toy"]["mean"], whole["toy"]["std"], 8],
                                  [whole["aesthetic"]["mean"], whole["aesthetic"]["std"], 8]]
    assert groups[0]["samples"][0]["seed"] == "4611686018427387909"
    seeds = [s["seed"] for g in groups for s in g["samples"]]
    assert len(set(seeds)) == 8 and all(isinstance(x, str) for x in seeds)
    assert len({s["seed"] for g in _shard(site, "eval_0")["groups"] for s in g["samples"]}) == 8


def test_build_skips_unsafe_files_and_broken_lines(tmp_path):
    run = write_run(tmp_path / "run", steps=1, prompts_per_step=1, per_prompt=1)
    manifest = run / "samples" / "step_10" / "manifest.jsonl"
    row = json.loads(manifest.read_text())
    escape = [dict(row, file=name, node=k) for k, name in enumerate(["../../config.yaml", "/etc/passwd", ".."])]
    manifest.write_text("\n".join(json.dumps(r) for r in [row, *escape]) + '\n{"prompt": "half a li')
    site = build_site(run).parent
    samples = _shard(site, "step_10")["groups"][0]["samples"]
    assert [s["src"] is None for s in samples] == [False, True, True, True]
    assert _index(site)["steps"][0]["bad_lines"] == 1
    assert sorted(p.name for p in (site / "media" / "step_10").iterdir()) == [row["file"]]


def test_cli_builds_into_the_given_folder(tmp_path):
    run = write_run(tmp_path / "run", steps=1, prompts_per_step=2, per_prompt=2)
    done = subprocess.run([sys.executable, "-m", "gallery", str(run), "--out", str(tmp_path / "site")], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "index.html").exists() and "4 samples" in done.stderr
    bad = subprocess.run([sys.executable, "-m", "gallery", str(tmp_path / "nope")], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "not a directory" in bad.stderr


# ---------------------------------------------------------------- server (no browser)


@pytest.fixture
def served(tmp_path):
    run = write_run(tmp_path / "run", steps=2, prompts_per_step=3, per_prompt=2)
    server = GalleryServer(run, port=0, rebuild_every=0.0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _request(url, body=None, headers=None, method=None):
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_server_saves_flags_and_refuses_bad_requests(served):
    url, flags_file = served.url + "api/flags", served.run_dir / "review" / "flags.json"
    json_type = {"Content-Type": "application/json"}
    flag = {"key": "step_10/s0007_n0010", "labels": ["reward hacked"], "note": "<b>text</b> overlay", "step": "step_10"}
    assert _request(url, flag, json_type)[0] == 200
    saved = json.loads(flags_file.read_text())["flags"]
    assert saved["step_10/s0007_n0010"]["labels"] == ["reward hacked"]
    assert saved["step_10/s0007_n0010"]["note"] == "<b>text</b> overlay"
    assert json.loads(_request(url)[1])["flags"].keys() == saved.keys()
    assert _request(url, flag, {"Content-Type": "text/plain"})[0] == 415
    assert _request(url, flag, {**json_type, "Origin": "http://evil.example"})[0] == 403
    assert _request(url, flag, {**json_type, "Host": "evil.example"})[0] == 403
    assert _request(url, {**flag, "note": "x" * 20_000}, json_type)[0] == 413
    for bad in ({**flag, "labels": "good"}, {**flag, "labels": ["x" * 41]}, {**flag, "extra": 1}, {**flag, "key": ""},
                {**flag, "note": 5}, [flag]):
        assert _request(url, bad, json_type)[0] == 400, bad
    assert _request(url, b"{not json", json_type)[0] == 400
    assert _request(url, {"key": flag["key"], "labels": [], "note": ""}, json_type)[0] == 200  # clearing deletes
    assert json.loads(flags_file.read_text())["flags"] == {}
    assert not list(flags_file.parent.glob("*.tmp"))
    assert _request(served.url + "data/")[0] == 404  # no directory listings


def test_server_picks_up_new_steps(served):
    status, body = _request(served.url + "data/index.js")
    assert status == 200 and b'"step_20"' in body and b'"step_30"' not in body
    write_run(served.run_dir.parent / "more", steps=3, prompts_per_step=1, per_prompt=1)
    os.rename(served.run_dir.parent / "more" / "samples" / "step_30", served.run_dir / "samples" / "step_30")
    assert b'"step_30"' in _request(served.url + "data/index.js")[1]


# ---------------------------------------------------------------- the page in chromium


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    driver = start_browser(tmp_path_factory.mktemp("downloads"))
    yield driver
    stop_browser(driver)


def _open(browser, url: str) -> None:
    browser.get("about:blank")
    browser.get_log("browser")  # drop what earlier pages logged
    browser.get(url)
    wait_render(browser)


def _tiles(browser) -> list:
    return browser.find_elements("css selector", "#app .tile")


def _choose(browser, name: str, value: str) -> None:
    from selenium.webdriver.support.ui import Select

    n = browser.execute_script("return window.__gallery.renders")
    Select(browser.find_element("css selector", f"#app select[name='{name}']")).select_by_value(value)
    wait_render(browser, n)


def test_page_loads_without_errors_and_shows_every_sample(browser, tmp_path):
    run = write_run(tmp_path / "run", steps=3, prompts_per_step=6, per_prompt=4, eval_step=True)
    _open(browser, (build_site(run)).as_uri())
    assert len(_tiles(browser)) == 24  # the latest training step: 6 groups of 4
    assert len(browser.find_elements("css selector", "#app section.group")) == 6
    visible = "Array.from(document.querySelectorAll('.tile img')).filter(i => i.getBoundingClientRect().top < innerHeight)"
    assert wait_for(browser, f"{visible}.length > 4 && {visible}.every(i => i.complete && i.naturalWidth === 64)")
    _choose(browser, "step", "*")
    _choose(browser, "layout", "samples")
    assert len(_tiles(browser)) == 96  # 4 steps x 24, one page
    for view in ("compare", "charts", "review", "run", "samples"):
        n = browser.execute_script("return window.__gallery.renders")
        browser.find_element("css selector", f"#tabs button[data-view='{view}']").click()
        wait_render(browser, n)
    assert browser.find_elements("css selector", "#app .tile")
    assert severe_console_entries(browser) == []


def test_filters_sorting_and_pages(browser, tmp_path):
    run = write_run(tmp_path / "run", steps=2, prompts_per_step=30, per_prompt=4)
    _open(browser, build_site(run).as_uri() + "#step=step_20&layout=samples")
    manifest = [json.loads(x) for x in (run / "samples" / "step_20" / "manifest.jsonl").read_text().splitlines()]
    assert len(_tiles(browser)) == 120 and "page 1 of 1" in browser.page_source
    _choose(browser, "layout", "groups")
    assert len(browser.find_elements("css selector", "#app section.group")) == 20  # 20 groups a page
    n = browser.execute_script("return window.__gallery.renders")
    browser.find_element("css selector", ".pager .next").click()
    wait_render(browser, n)
    assert len(browser.find_elements("css selector", "#app section.group")) == 10

    _choose(browser, "layout", "samples")
    _choose(browser, "task", "counting")
    assert len(_tiles(browser)) == 4 * sum(1 for r in manifest[::4] if r["metadata"]["task"] == "counting")
    _choose(browser, "task", "")
    n = browser.execute_script("return window.__gallery.renders")
    word = manifest[0]["prompt"].split()[-1]
    browser.find_element("css selector", "input.q").send_keys(word)
    wait_render(browser, n)
    assert len(_tiles(browser)) == sum(word in r["prompt"] for r in manifest) > 0
    browser.find_element("css selector", "input.q").clear()
    n = browser.execute_script("return window.__gallery.renders")
    browser.execute_script("document.querySelector('input.q').dispatchEvent(new Event('input'))")
    wait_render(browser, n)

    _choose(browser, "sort", "reward-desc")
    shown = [float(x) for x in browser.execute_script(
        "return Array.from(document.querySelectorAll('#app .tile .r.sel')).map(e => e.textContent.split(' ').pop())")]
    assert shown == sorted(shown, reverse=True) and len(shown) == 120
    assert shown[0] == pytest.approx(max(r["rewards"]["toy"] for r in manifest), abs=1e-3)
    n = browser.execute_script("return window.__gallery.renders")
    browser.find_element("css selector", "input.min").send_keys("0.5\n")
    wait_render(browser, n)
    assert len(_tiles(browser)) == sum(r["rewards"]["toy"] >= 0.5 for r in manifest)
    assert severe_console_entries(browser) == []


def test_hostile_prompt_renders_as_text(browser, tmp_path):
    prompts = [(HOSTILE, {"task": HOSTILE, "clauses": [], "note": "</script><script>window.__pwned=2</script>"})]
    run = write_run(tmp_path / "run", steps=1, prompts_per_step=1, per_prompt=2, prompts=prompts)
    _open(browser, build_site(run).as_uri())
    assert browser.find_element("css selector", "#app h3.prompt").text == HOSTILE
    browser.find_element("css selector", "#app .tile img").click()  # the lightbox shows prompt and metadata
    wait_for(browser, "!document.getElementById('lightbox').hidden")
    time.sleep(0.2)
    assert browser.execute_script("return window.__pwned") is None
    assert not browser.find_elements("css selector", "#app script, #app h3 img, #lightbox script")
    assert severe_console_entries(browser) == []


def test_video_plays(browser, tmp_path):
    run = write_run(tmp_path / "run", steps=1, prompts_per_step=1, per_prompt=2, video=True)
    _open(browser, build_site(run).as_uri())
    assert len(browser.find_elements("css selector", "#app video")) == 2
    browser.execute_script("document.querySelector('#app video').play()")
    assert wait_for(browser, "(v => !v.paused && v.currentTime > 0 && v.videoWidth === 64)(document.querySelector('#app video'))")
    assert severe_console_entries(browser) == []


def test_tree_groups_show_parents_and_children(browser, tmp_path):
    run = write_run(tmp_path / "run", steps=1, prompts_per_step=2, per_prompt=4, tree=True)
    _open(browser, build_site(run).as_uri())
    group = browser.find_element("css selector", "#app section.group.is-tree")
    labels = [e.text for e in group.find_elements("css selector", ".node-label")]
    assert [lab.split(" ·")[0] for lab in labels] == ["tree node 1 (not saved)", "tree node 2 (not saved)"]
    assert all("2 leaves" in lab for lab in labels)
    assert len(group.find_elements("css selector", "ul.tree > li .tile")) == 4


def _js_number(v: float) -> str:
    """The page's formatNumber for values between 1e-3 and 1e5: 4 significant digits, no trailing zeros."""
    x = float(f"{v:.4g}")
    return str(int(x)) if x == int(x) else repr(x)


def test_group_header_says_the_true_group_size_and_labels_nodes_and_seeds(browser, tmp_path):
    """A group of 8 with 4 saved reads "group of 8 · 4 saved" and the reward statistics over all 8 (not the saved
    4's); a chain sample reads "tree node 10, from node 9" with an explanation; each card its own noise seed."""
    run = write_run(tmp_path / "run", steps=1, prompts_per_step=2, per_prompt=4, group_size=8, eval_step=True)
    rows = [json.loads(x) for x in (run / "samples" / "step_10" / "manifest.jsonl").read_text().splitlines()]
    _open(browser, build_site(run).as_uri())
    group = next(g for g in browser.find_elements("css selector", "#app section.group")
                 if g.find_element("css selector", "h3.prompt").text == rows[0]["prompt"])
    chips = [e.text for e in group.find_elements("css selector", ".chip")]
    whole = rows[0]["group_rewards"]["toy"]
    saved = [r["rewards"]["toy"] for r in rows[:4]]
    assert "group of 8 · 4 saved" in chips, chips
    assert f"toy {_js_number(whole['mean'])} ± {_js_number(whole['std'])} over all 8" in chips, chips
    assert _js_number(whole["mean"]) != _js_number(sum(saved) / 4)  # the saved 4's mean would read otherwise
    tile = next(t for t in group.find_elements("css selector", ".tile") if t.get_attribute("data-key").endswith("_n0010"))
    node = tile.find_element("css selector", ".ids .node")
    assert node.text == "tree node 10, from node 9" and "sampling tree" in node.get_attribute("title")
    assert tile.find_element("css selector", ".ids .seed").text == f"noise seed {rows[0]['noise_seed']}"
    assert "tree node: a state in the prompt's sampling tree" in browser.find_element("css selector", "#app .id-legend").text
    _choose(browser, "step", "eval_0")
    seeds = [e.text for e in browser.find_elements("css selector", "#app .tile .ids .seed")]
    assert len(seeds) == 8 == len(set(seeds)) and all(x.startswith("noise seed ") for x in seeds)
    assert not browser.find_elements("css selector", "#app .tile .ids .node")  # evaluation samples have no tree
    assert "one starting noise" not in chips  # every saved sample has its own x_T here
    manifest = run / "samples" / "step_10" / "manifest.jsonl"  # a plan with initial_noise="shared": one x_T a prompt
    manifest.write_text("".join(json.dumps({**r, "noise_seed": 99 if r["group"] == 0 else r["noise_seed"]}) + "\n"
                                for r in rows))
    _open(browser, build_site(run).as_uri() + "#step=step_10")
    shared = [g.find_element("css selector", "h3.prompt").text for g in browser.find_elements("css selector", "#app section.group")
              if "one starting noise" in [e.text for e in g.find_elements("css selector", ".chip")]]
    assert shared == [rows[0]["prompt"]]
    assert severe_console_entries(browser) == []


def test_flagging_saves_to_the_run_directory_when_served(browser, tmp_path):
    run = write_run(tmp_path / "run", steps=1, prompts_per_step=2, per_prompt=2)
    server = GalleryServer(run, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _open(browser, server.url)
        tile = _tiles(browser)[1]
        key = tile.get_attribute("data-key")
        tile.find_element("css selector", "button.flag[data-label='reward hacked']").click()
        flags_file = run / "review" / "flags.json"
        deadline = time.monotonic() + 30  # a loaded machine (two xdist workers) can be slow to post it
        while not (flags_file.exists() and key in json.loads(flags_file.read_text())["flags"]):
            assert time.monotonic() < deadline, "flag not saved"
            time.sleep(0.05)
        tile = next(t for t in _tiles(browser) if t.get_attribute("data-key") == key)
        tile.find_element("css selector", "button.note-btn").click()
        tile.find_element("css selector", "textarea").send_keys("<script>window.__pwned=3</script> text baked in")
        tile.find_element("css selector", "button.save-note").click()
        wait_for(browser, f"document.querySelector('.tile[data-key=\"{key}\"] p.note')")
        saved = json.loads(flags_file.read_text())["flags"][key]
        assert saved["labels"] == ["reward hacked"] and saved["note"].endswith("text baked in")
        _open(browser, server.url + "#view=review")  # a reload shows the saved flag
        assert [t.get_attribute("data-key") for t in _tiles(browser)] == [key]
        assert browser.execute_script("return window.__pwned") is None
        assert severe_console_entries(browser) == []
    finally:
        server.shutdown()
        server.server_close()


def test_served_page_shows_steps_written_while_it_is_open(browser, tmp_path):
    run = write_run(tmp_path / "run", steps=2, prompts_per_step=2, per_prompt=2)
    server = GalleryServer(run, port=0, rebuild_every=0.0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    fast = browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": "window.GALLERY_POLL_MS = 200"})
    try:
        _open(browser, server.url)
        step_options = "Array.from(document.querySelectorAll('select[name=step] option')).map(o => o.value)"
        assert "step_30" not in browser.execute_script("return " + step_options)
        write_run(tmp_path / "more", steps=3, prompts_per_step=2, per_prompt=2)
        os.rename(tmp_path / "more" / "samples" / "step_30", run / "samples" / "step_30")
        wait_for(browser, f"{step_options}.includes('step_30')")
        assert "step_30" in browser.find_element("id", "notice").text
        assert severe_console_entries(browser) == []
    finally:
        browser.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", fast)
        server.shutdown()
        server.server_close()


def test_static_flags_stay_in_the_browser_and_export(browser, tmp_path):
    run = write_run(tmp_path / "run", steps=1, prompts_per_step=2, per_prompt=2)
    url = build_site(run).as_uri()
    _open(browser, url)
    key = _tiles(browser)[0].get_attribute("data-key")
    _tiles(browser)[0].find_element("css selector", "button.flag[data-label='good']").click()
    wait_for(browser, "document.querySelector('.tile.f-good')")
    _open(browser, url + "#view=review")
    assert [t.get_attribute("data-key") for t in _tiles(browser)] == [key]
    browser.find_element("css selector", "button.export").click()
    target = browser._flowgrpo_downloads / f"flags-{run.name}.json"
    deadline = time.monotonic() + 10
    while not target.exists():
        assert time.monotonic() < deadline, "no export downloaded"
        time.sleep(0.05)
    exported = json.loads(target.read_text())
    assert exported["run"] == "run" and exported["flags"][key]["labels"] == ["good"]
    browser.execute_script("localStorage.clear()")  # another browser: nothing flagged until the import
    _open(browser, url + "#view=review")
    assert _tiles(browser) == []
    n = browser.execute_script("return window.__gallery.renders")
    browser.find_element("css selector", "input.import").send_keys(str(target))
    wait_render(browser, n)
    assert [t.get_attribute("data-key") for t in _tiles(browser)] == [key]
    assert not (run / "review").exists()  # a static site never writes the run directory
    assert severe_console_entries(browser) == []


def test_charts_mark_the_watch_alarms(browser, tmp_path):
    run = write_run(tmp_path / "run", steps=3, prompts_per_step=1, per_prompt=1, alarm_from=20)
    _open(browser, build_site(run).as_uri() + "#view=charts")
    titles = [e.text for e in browser.find_elements("css selector", "#app figcaption")]
    assert "guard/held_out" in titles
    marked = browser.execute_script(
        "return Array.from(document.querySelectorAll('#app figure')).map(f => [f.querySelector('figcaption').textContent,"
        " Array.from(f.querySelectorAll('g.alarm')).map(g => Number(g.dataset.x))])")
    marks = {title: xs for title, xs in marked}
    for title in ("reward: toy", "proxy vs held-out reward", "gap: proxy − held-out", "guard/held_out"):
        assert marks[title] == [20, 30], (title, marks[title])  # the two evaluations with an alarm
    assert marks["loss"] == []
    assert "reward-hacking alarm (2)" in browser.find_element("css selector", "#app").text
    assert severe_console_entries(browser) == []
    clean = write_run(tmp_path / "clean", steps=3, prompts_per_step=1, per_prompt=1)  # no watch metrics: no marks
    _open(browser, build_site(clean).as_uri() + "#view=charts")
    assert browser.execute_script("return document.querySelectorAll('#app g.alarm').length") == 0


def test_charts_and_compare(browser, tmp_path):
    prompts = [prompt_for(k) for k in range(2)]  # every step samples both prompts
    run = write_run(tmp_path / "run", steps=3, prompts_per_step=2, per_prompt=2, eval_step=True, prompts=prompts)
    url = build_site(run).as_uri()
    _open(browser, url + "#view=charts")
    titles = [e.text for e in browser.find_elements("css selector", "#app figcaption")]
    assert {"reward: toy", "proxy vs held-out reward", "gap: proxy − held-out", "loss", "approx_kl"} <= set(titles)
    assert browser.execute_script("return document.querySelectorAll('#app svg path[stroke]').length") >= 6
    _open(browser, url + "#view=compare&prompt=" + urllib.request.quote(prompts[1][0]))
    rows = browser.find_elements("css selector", "#app .compare-row")
    assert [r.get_attribute("data-step") for r in rows] == ["eval_0", "step_30"]  # base vs now
    assert all(len(r.find_elements("css selector", ".tile")) == 2 for r in rows)
    n = browser.execute_script("return window.__gallery.renders")
    browser.find_element("css selector", "#app .compare-main input[type=checkbox]").click()
    wait_render(browser, n)
    rows = browser.find_elements("css selector", "#app .compare-row")
    assert [r.get_attribute("data-step") for r in rows] == ["eval_0", "step_10", "step_20", "step_30"]
    n = browser.execute_script("return window.__gallery.renders")
    next(a for a in browser.find_elements("css selector", ".prompt-list a") if a.text == prompts[0][0]).click()
    wait_render(browser, n)
    assert browser.find_element("css selector", "#app h2.prompt").text == prompts[0][0]
    assert severe_console_entries(browser) == []
