"""Tiny models of the real diffusers classes: tokenizer, SD3 round trip (no downloads)."""

import torch
from diffusers import StableDiffusion3Pipeline, WanPipeline
from transformers import AutoTokenizer, CLIPTokenizer

from flowgrpo.run.paths import resolve_pretrained
from flowgrpo.tiny import (
    TinySD3Sizes,
    TinyWanSizes,
    build_clip_tokenizer,
    build_t5_tokenizer,
    build_tiny_sd3_pipeline,
    build_tiny_wan_pipeline,
)

SMALL = TinySD3Sizes(image_size=32, vae_channels=(16, 16), text_width=32, num_layers=1, num_heads=2, head_dim=16)


def test_tokenizer_words_are_single_tokens_and_unknown_text_falls_back(tmp_path):
    tok = build_clip_tokenizer(["a photo of a red circle", "two blue squares"], max_length=12)
    ids = tok("a photo of a red circle").input_ids
    assert tok.convert_ids_to_tokens(ids) == [
        "<|startoftext|>", "a</w>", "photo</w>", "of</w>", "a</w>", "red</w>", "circle</w>", "<|endoftext|>"
    ]
    unseen = tok.convert_ids_to_tokens(tok("zebra!").input_ids)
    assert tok.unk_token not in unseen[1:-1] and len(unseen) > 3  # characters, never "unknown"
    tok.save_pretrained(tmp_path)
    assert CLIPTokenizer.from_pretrained(tmp_path)("two blue squares").input_ids == tok("two blue squares").input_ids


def test_tiny_sd3_round_trips_through_save_and_from_pretrained(tmp_path):
    tok = build_clip_tokenizer(["a photo of a red circle"], max_length=8)
    pipe = build_tiny_sd3_pipeline(tok, SMALL, seed=1)
    pipe.save_pretrained(tmp_path)
    loaded = StableDiffusion3Pipeline.from_pretrained(tmp_path)
    kwargs = dict(num_inference_steps=2, height=32, width=32, max_sequence_length=8, output_type="pt")
    a = pipe("a red circle", generator=torch.Generator().manual_seed(0), **kwargs).images
    b = loaded("a red circle", generator=torch.Generator().manual_seed(0), **kwargs).images
    assert a.shape == (1, 3, 32, 32)
    torch.testing.assert_close(a, b)


def test_resolve_pretrained(tmp_path):
    assert resolve_pretrained(str(tmp_path)) == str(tmp_path)
    assert resolve_pretrained("stabilityai/stable-diffusion-3.5-medium") == "stabilityai/stable-diffusion-3.5-medium"
    try:
        resolve_pretrained("./no/such/folder")
    except FileNotFoundError as exc:
        assert "does not exist" in str(exc)
    else:
        raise AssertionError("a missing local folder must raise")


def test_tokenizer_is_a_pure_function_of_its_corpus():
    corpus = ["a photo of a red circle left of a blue square", "three green triangles", "four circles"]
    a, b = build_clip_tokenizer(corpus), build_clip_tokenizer(list(reversed(corpus)))
    assert a.get_vocab() == b.get_vocab()
    assert len(a("a photo of a red circle left of a blue square").input_ids) == 2 + 11  # one token a word


def test_t5_tokenizer_words_are_single_tokens_and_it_is_a_pure_function_of_its_corpus(tmp_path):
    corpus = ["a video of a red circle moving left", "a video of a square moving up quickly"]
    tok = build_t5_tokenizer(corpus, max_length=12)
    ids = tok("a video of a red circle moving left").input_ids
    assert tok.convert_ids_to_tokens(ids) == ["▁a", "▁video", "▁of", "▁a", "▁red", "▁circle", "▁moving", "▁left", "</s>"]
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)  # T5's layout
    unseen = tok.convert_ids_to_tokens(tok("zebra").input_ids)
    assert unseen == ["▁z", "e", "b", "r", "a", "</s>"]  # characters, never "unknown"
    assert build_t5_tokenizer(list(reversed(corpus))).get_vocab() == tok.get_vocab()
    tok.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path)("a square moving up").input_ids == tok("a square moving up").input_ids


def test_tiny_wan_round_trips_through_save_and_from_pretrained(tmp_path):
    sizes = TinyWanSizes(num_frames=5, vae_base_dim=8, latent_channels=8, text_width=32, num_layers=1, num_heads=2,
                         head_dim=12, ffn_dim=32, freq_dim=32)
    pipe = build_tiny_wan_pipeline(build_t5_tokenizer(["a red circle moving up"], max_length=8), sizes, seed=1)
    pipe.save_pretrained(tmp_path)
    loaded = WanPipeline.from_pretrained(tmp_path)
    assert (loaded.vae_scale_factor_spatial, loaded.vae_scale_factor_temporal) == (4, 4)
    kwargs = dict(num_inference_steps=2, height=32, width=32, num_frames=5, max_sequence_length=8, output_type="pt")
    a = pipe("a red circle moving up", generator=torch.Generator().manual_seed(0), **kwargs).frames
    b = loaded("a red circle moving up", generator=torch.Generator().manual_seed(0), **kwargs).frames
    assert a.shape == (1, 5, 3, 32, 32)
    torch.testing.assert_close(a, b)
