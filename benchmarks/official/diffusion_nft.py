"""DiffusionNFT's launches (NVlabs/DiffusionNFT): the ml_collections configs of config/nft.py, each run whole, and the
constants scripts/train_nft_sd3.py and its pipeline hard-code."""

from __future__ import annotations

from official import Checkout, Launch, code_fact, trace_ml_collections

REPOSITORY = "NVlabs/DiffusionNFT"
ENV = "DIFFUSION_NFT_PATH"
PRESETS = ("diffusion_nft",)

# config function -> (flowgrpo model config, flowgrpo rewards): the runs of the paper's tables
RUNS = {
    "sd3_geneval": ("sd3_5_medium", ["geneval"]),
    "sd3_ocr": ("sd3_5_medium", ["ocr"]),
    "sd3_pickscore": ("sd3_5_medium", ["pickscore"]),
    "sd3_hpsv2": ("sd3_5_medium", ["hpsv2"]),
    "sd3_multi_reward": ("sd3_5_medium", ["pickscore", "hpsv2", "clipscore"]),
}
SCRIPT = "scripts/train_nft_sd3.py"


def code_facts(checkout: Checkout) -> dict:
    """The constants the training script and pipeline fix, each at its line (``code.*`` keys)."""
    return {
        "code.ema_decay": code_fact(checkout, SCRIPT, r"EMAModuleWrapper\([^)]*decay=([\d.]+)"),
        "code.ema_update_step_interval": code_fact(checkout, SCRIPT, r"EMAModuleWrapper\([^)]*update_step_interval=(\d+)"),
        "code.lora_rank": code_fact(checkout, SCRIPT, r"LoraConfig\(\s*r=(\d+)"),
        "code.lora_alpha": code_fact(checkout, SCRIPT, r"LoraConfig\([^)]*lora_alpha=(\d+)"),
    }


def launches(checkout: Checkout, preset: str) -> list[Launch]:
    facts = code_facts(checkout)
    out = []
    for function, (model, rewards) in RUNS.items():
        values, _ = trace_ml_collections(checkout, "config/nft.py", function)
        values.update(facts)
        entry = code_fact(checkout, "config/nft.py", rf"^def ({function})\(", convert=str).source
        out.append(Launch(function, model, rewards, values, entry))
    return out
