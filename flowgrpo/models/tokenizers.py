"""Tokenizers built locally, in the real formats, from a word list (no download).

``build_qwen_tokenizer`` and ``build_mistral_processor``: Qwen's byte-level BPE with its chat template (Qwen2.5-VL,
Qwen3) and Mistral-Small-3's processor (FLUX.2-dev). ``build_clip_tokenizer``: a CLIP-format byte-level BPE (``CLIPTokenizer``) whose merges make every corpus word
one token; ``build_t5_tokenizer``: a T5-format Unigram (``T5Tokenizer``, as T5 and UMT5 read it) whose every
corpus word is one piece. They save and load with ``save_pretrained`` / ``from_pretrained`` like the real ones.
The tiny models (flowgrpo/tiny/builders.py) and the random-weight real architectures
(flowgrpo/models/random_init.py) use them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

BOS, EOS = "<|startoftext|>", "<|endoftext|>"


def _train_bpe(words: Counter, end_mark: str = "</w>") -> list[tuple[str, str]]:
    """Byte-pair merges learned from word counts until every word is one symbol.

    Deterministic (ties go to the lexicographically smallest pair); the ``tokenizers`` trainer is
    not: its tie-breaking follows hash-map order, so two builds gave different vocabularies, and a
    resumed pretraining would have re-tokenized its prompts differently.
    """
    symbols = {w: tuple(w[:-1]) + (w[-1] + end_mark,) for w in words}
    merges: list[tuple[str, str]] = []
    while True:
        pairs: Counter = Counter()
        for word, seq in symbols.items():
            for pair in zip(seq, seq[1:]):
                pairs[pair] += words[word]
        if not pairs:
            return merges
        best = min(pairs, key=lambda pair: (-pairs[pair], pair))
        merges.append(best)
        for word, seq in symbols.items():
            merged, i = [], 0
            while i < len(seq):
                if seq[i : i + 2] == best:
                    merged.append(seq[i] + seq[i + 1])
                    i += 2
                else:
                    merged.append(seq[i])
                    i += 1
            symbols[word] = tuple(merged)


def build_clip_tokenizer(corpus: Iterable[str], max_length: int = 16):
    """A CLIP-format byte-level BPE tokenizer whose merges make every corpus word one token.

    The vocabulary holds every byte symbol with and without the end-of-word mark, so any other
    text still tokenizes (into characters), never into "unknown". ``max_length`` is the padded
    length the SD3 pipeline uses. The same corpus always gives the same tokenizer.
    """
    from tokenizers import pre_tokenizers
    from transformers import CLIPTokenizer

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    for c in alphabet:
        vocab[c + "</w>"] = len(vocab)
    # split text exactly as the CLIP tokenizer will (lower-case, words, byte-level symbols)
    splitter = CLIPTokenizer(vocab={**vocab, BOS: len(vocab), EOS: len(vocab) + 1}, merges=[])._tokenizer
    words: Counter = Counter()
    for text in corpus:
        normalized = splitter.normalizer.normalize_str(text) if splitter.normalizer else text.lower()
        words.update(piece for piece, _ in splitter.pre_tokenizer.pre_tokenize_str(normalized))
    merges = _train_bpe(words)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    vocab[BOS] = len(vocab)
    vocab[EOS] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=max_length)


def build_t5_tokenizer(corpus: Iterable[str], max_length: int = 16):
    """A T5-format Unigram tokenizer (``T5Tokenizer``, as UMT5 uses) whose every corpus word is one token.

    The vocabulary is ``<pad>, </s>, <unk>``, then each corpus word (with T5's word-start mark "▁")
    in sorted order, then single characters (with and without the mark) at a low score, so other
    text still tokenizes, into characters. Words beat their spellings because a whole word scores
    higher than any split. A pure function of the set of corpus words.
    """
    from transformers import T5Tokenizer

    words = sorted({w for text in corpus for w in text.split()})
    chars = sorted({c for w in words for c in w} | set("abcdefghijklmnopqrstuvwxyz0123456789.,!?'-"))
    scores = {"<pad>": 0.0, "</s>": 0.0, "<unk>": 0.0, "▁": -5.0}  # T5's ids: pad 0, eos 1, unk 2
    for w in words:
        scores.setdefault("▁" + w, -1.0)
    for c in chars:  # fallback pieces; a word that is one character keeps its word score
        scores.setdefault("▁" + c, -10.0)
        scores.setdefault(c, -10.0)
    return T5Tokenizer(vocab=list(scores.items()), extra_ids=0, model_max_length=max_length)


# Qwen's pre-tokenizer: contractions, letters, single digits, punctuation runs, newlines, spaces (as Qwen2 / Qwen3)
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
              r"\s+(?!\S)|\s+")
QWEN_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")
# the chat format of Qwen3 (and Qwen2.5's without tools): what the Z-Image and FLUX.2-klein pipelines render
QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def build_qwen_tokenizer(corpus: Iterable[str], max_length: int = 64):
    """A Qwen-format byte-level BPE (``Qwen2TokenizerFast``, as Qwen2.5-VL and Qwen3 read it) whose merges make
    every pre-token of the corpus (a word with its leading space, a punctuation run, a newline) one token, with
    Qwen's special tokens (``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>`` as padding, ``<think>``) and its
    chat template. Put the pipeline's prompt templates in the corpus so they tokenize as the real ones do, a token
    per word. Any other text still tokenizes, into bytes. The same corpus always gives the same tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import Qwen2TokenizerFast

    split = pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False)
    pre = pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    words: Counter = Counter()
    for text in corpus:
        for special in QWEN_SPECIAL:
            text = text.replace(special, "\n")
        words.update(piece for piece, _ in pre.pre_tokenize_str(text))
    merges = _train_bpe(words, end_mark="")
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    backend.pre_tokenizer = pre
    backend.decoder = decoders.ByteLevel()
    tokenizer = Qwen2TokenizerFast(tokenizer_object=backend, model_max_length=max_length, pad_token="<|endoftext|>",
                                   eos_token="<|im_end|>", unk_token=None, bos_token=None, padding_side="right")
    tokenizer.add_special_tokens({"additional_special_tokens": [t for t in QWEN_SPECIAL if t != "<|endoftext|>"]})
    tokenizer.chat_template = QWEN_CHAT_TEMPLATE
    return tokenizer


# Mistral's control tokens (ids 0..3 as in Mistral's tekken vocabulary: <unk>, <s>, </s>, [INST]; then the rest)
MISTRAL_SPECIAL = ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[IMG]",
                   "[IMG_BREAK]", "[IMG_END]", "<pad>")
# Mistral-Small-3's chat format for text turns: <s>[SYSTEM_PROMPT]...[/SYSTEM_PROMPT][INST]...[/INST], content parts
# given as [{"type": "text", "text": ...}] (as Flux2Pipeline's format_input builds them)
MISTRAL_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['content'] is string %}{% set text = message['content'] %}"
    "{% else %}{% set text = message['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('') %}"
    "{% endif %}"
    "{% if message['role'] == 'system' %}[SYSTEM_PROMPT]{{ text }}[/SYSTEM_PROMPT]"
    "{% elif message['role'] == 'user' %}[INST]{{ text }}[/INST]"
    "{% else %}{{ text }}{{ eos_token }}{% endif %}{% endfor %}"
)


def build_mistral_processor(corpus: list[str], max_length: int = 16):
    """A local ``PixtralProcessor`` (Mistral-Small-3's processor class): a byte-level BPE tokenizer whose merges make
    every corpus pre-token one token, Mistral's control tokens, right padding with ``<pad>``, and the chat
    template above; a small Pixtral image processor. The corpus gets Flux2Pipeline's system message."""
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PixtralImageProcessor, PixtralProcessor, PreTrainedTokenizerFast

    split = pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False)
    pre = pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    words: Counter = Counter()
    for text in list(corpus) + [SYSTEM_MESSAGE]:
        words.update(piece for piece, _ in pre.pre_tokenize_str(text))
    merges = _train_bpe(words, end_mark="")
    vocab = {t: i for i, t in enumerate(MISTRAL_SPECIAL)}
    for c in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab.setdefault(c, len(vocab))
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    backend.pre_tokenizer = pre
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, model_max_length=max_length, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="<pad>", padding_side="right",
    )
    tokenizer.add_special_tokens({"additional_special_tokens": [t for t in MISTRAL_SPECIAL[3:] if t != "<pad>"]})
    tokenizer.chat_template = MISTRAL_CHAT_TEMPLATE
    image_processor = PixtralImageProcessor(size={"longest_edge": 32}, patch_size={"height": 8, "width": 8})
    return PixtralProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=8, spatial_merge_size=2,
                            image_token="[IMG]", image_break_token="[IMG_BREAK]", image_end_token="[IMG_END]",
                            chat_template=MISTRAL_CHAT_TEMPLATE)



__all__ = ["BOS", "EOS", "QWEN_CHAT_TEMPLATE", "build_clip_tokenizer", "build_mistral_processor", "build_qwen_tokenizer",
           "build_t5_tokenizer"]
