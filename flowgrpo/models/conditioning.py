"""Conditioning rows: what ``FlowModel.encode_prompts`` returns once per prompt (its text, and for an editing model
its condition images' latents), gathered per latent later (``Conditioning.select``), with the unconditional row
classifier-free guidance batches as ``[uncond; cond]``."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Optional

import torch


@dataclass
class Conditioning:
    """Text conditioning for P prompts, computed once per prompt (rows are gathered per latent).

    ``negative_*`` is the unconditional embedding (the empty prompt, as the pipelines use) for
    classifier-free guidance: one row shared by every prompt, or None when the model runs no CFG. An editing family
    whose negative prompt is encoded with each prompt's condition images (Qwen-Image-Edit: the VLM reads them in both
    passes) gives one negative row per prompt instead and sets ``negative_per_row``: ``select`` then gathers the
    negative rows with the prompt rows, and ``concat`` concatenates them.
    """

    prompt_embeds: torch.Tensor  # [P, L, D] text-token embeddings (SD3: CLIP-L|CLIP-G padded ++ T5 tokens; FLUX: T5)
    pooled_prompt_embeds: Optional[torch.Tensor] = None  # [P, Dp] pooled (SD3: CLIP-L ++ CLIP-G; FLUX: CLIP-L)
    # [1, L, D] unconditional ("" prompt) embeddings, or None; [P, L, D] with negative_per_row
    negative_prompt_embeds: Optional[torch.Tensor] = None
    negative_pooled_prompt_embeds: Optional[torch.Tensor] = None  # [1, Dp] unconditional pooled embedding, or None
    text_ids: Optional[torch.Tensor] = None  # [L, 3] FLUX text position ids (shared by all rows); None for SD3
    # [P, L] which text tokens are real (1) or padding (0), for families whose transformer masks the text
    # (Qwen-Image, Z-Image); None where the embeddings are used whole (SD3, FLUX, Wan)
    prompt_mask: Optional[torch.Tensor] = None
    negative_prompt_mask: Optional[torch.Tensor] = None  # [1, L] the unconditional row's mask (or [P, L]), or None
    # the prompts' condition images as latents, one tensor per reference [P, C, h_k, w_k] in the family's latent space
    # (an edit's source: one); the unconditional pass sees them too, as the editing pipelines' negative passes do.
    # None for a text-only prompt
    references: Optional[tuple[torch.Tensor, ...]] = None
    # the negative_* fields hold one row per prompt row (gathered and concatenated with them), not one shared row
    negative_per_row: bool = False

    def __len__(self) -> int:
        return self.prompt_embeds.shape[0]

    def select(self, index: torch.Tensor) -> Conditioning:
        """Rows ``index`` ([N] long) for a batch of N latents; shared fields are kept as they are."""
        index = torch.as_tensor(index, dtype=torch.long, device=self.prompt_embeds.device)

        def rows(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            return None if t is None else t.index_select(0, index.to(t.device))

        refs = self.references
        negative = {}
        if self.negative_per_row:
            negative = dict(negative_prompt_embeds=rows(self.negative_prompt_embeds),
                            negative_pooled_prompt_embeds=rows(self.negative_pooled_prompt_embeds),
                            negative_prompt_mask=rows(self.negative_prompt_mask))
        return replace(
            self,
            prompt_embeds=rows(self.prompt_embeds),
            pooled_prompt_embeds=rows(self.pooled_prompt_embeds),
            prompt_mask=rows(self.prompt_mask),
            references=None if refs is None else tuple(rows(r) for r in refs),
            **negative,
        )

    def to(self, device: torch.device | str) -> Conditioning:
        def move(t):
            if isinstance(t, tuple):
                return tuple(r.to(device) for r in t)
            return t.to(device) if isinstance(t, torch.Tensor) else t

        return Conditioning(*(move(getattr(self, f.name)) for f in fields(self)))

    def unconditional(self) -> Conditioning:
        """The unconditional rows for this batch: the negative embedding repeated ``len(self)`` times (with
        ``negative_per_row``, each row's own negative)."""
        if self.negative_prompt_embeds is None:
            raise ValueError(
                "this Conditioning has no unconditional embedding; encode prompts with a model whose "
                "guidance uses classifier-free guidance (SD3, or FLUX without guidance embeddings)"
            )
        n = len(self)
        neg_pooled, neg_mask = self.negative_pooled_prompt_embeds, self.negative_prompt_mask
        return Conditioning(
            prompt_embeds=self.negative_prompt_embeds.expand(n, -1, -1),
            pooled_prompt_embeds=None if neg_pooled is None else neg_pooled.expand(n, -1),
            text_ids=self.text_ids,
            prompt_mask=None if neg_mask is None else neg_mask.expand(n, -1),
            references=self.references,
        )

    def concat(self, other: Conditioning) -> Conditioning:
        """Rows of ``self`` then rows of ``other`` (the CFG batch ``[uncond; cond]``)."""
        pooled, mask = None, None
        if self.pooled_prompt_embeds is not None:
            pooled = torch.cat([self.pooled_prompt_embeds, other.pooled_prompt_embeds])
        if self.prompt_mask is not None:
            mask = torch.cat([self.prompt_mask, other.prompt_mask])
        refs = None
        if self.references is not None:
            refs = tuple(torch.cat([a, b]) for a, b in zip(self.references, other.references))
        negative = {}
        if self.negative_per_row or other.negative_per_row:  # each side's rows (a shared row repeated for its rows)
            def both(name: str) -> Optional[torch.Tensor]:
                a, b = getattr(self, name), getattr(other, name)
                if a is None or b is None:
                    return None
                return torch.cat([a.expand(len(self), *a.shape[1:]), b.expand(len(other), *b.shape[1:])])

            negative = dict(negative_per_row=True, **{name: both(name) for name in (
                "negative_prompt_embeds", "negative_pooled_prompt_embeds", "negative_prompt_mask")})
        return replace(
            self,
            prompt_embeds=torch.cat([self.prompt_embeds, other.prompt_embeds]),
            pooled_prompt_embeds=pooled,
            prompt_mask=mask,
            references=refs,
            **negative,
        )
