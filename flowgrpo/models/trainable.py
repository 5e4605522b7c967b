"""The trained weights of a model adapter: a mixin of ``FlowModel`` (as diffusers splits ``PeftAdapterMixin`` from
``ModelMixin``), apart from the model as functions of tensors (base.py).

- set-up (``_setup_finetune``): a LoRA adapter through peft on each trained expert (``init_lora_weights="gaussian"``,
  the weights cast to float32 with ``cast_training_params``), or the whole network trained; the frozen reference,
  when ``model.reference`` asks for one, is a ``WeightCopy`` (copies.py) of the trained weights as loaded;
- ``trainable_parameters`` (what the optimizer updates), ``reference()`` (the reference policy: LoRA disabled, or
  the frozen copy swapped into the trained weights), ``networks`` (what a sharded run shards), ``take_reference``
  (the frozen copy taken again, by a sharded policy once its parameters are DTensors);
- ``trained_state`` / ``save_trainable`` / ``load_trainable``: diffusers' LoRA files, or the transformer folder.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
import contextlib
from contextlib import contextmanager
from typing import Optional

import torch

from flowgrpo.models.config import ADAPTER_NAME, ModelConfig
from flowgrpo.models.copies import WeightCopy
from flowgrpo.models.families import DEFAULT_LORA_TARGETS, FAMILIES


class TrainableWeights:
    """LoRA or full fine-tuning of a model's denoising networks, its reference policy, and saving / loading what
    trains. The host class (``FlowModel``) provides ``config``, ``experts`` (the networks by component name),
    ``pipeline_class`` (whose ``save_lora_weights`` / ``lora_state_dict`` write and read LoRA files) and
    ``_in_reference``, and calls ``_setup_finetune`` once its networks are loaded."""

    config: ModelConfig
    experts: dict[str, torch.nn.Module]
    _in_reference: bool
    reference_copy: Optional[WeightCopy] = None  # frozen_copy: the trained weights as loaded (the base model)

    def _setup_finetune(self) -> None:
        cfg = self.config
        mode = cfg.reference
        if mode == "auto":
            mode = "adapter_disabled" if cfg.finetune == "lora" else "frozen_copy"
        self.reference_mode = mode
        trained = cfg.trained_experts or list(self.experts)
        unknown = [name for name in trained if name not in self.experts]
        if unknown:
            from flowgrpo.models.config import ModelConfigError

            raise ModelConfigError(f"model.trained_experts names {unknown}, which this model does not have; its "
                                   f"denoising networks are {list(self.experts)}: list some of them, or null for all")
        self.trained_experts = [name for name in self.experts if name in trained]
        self.transformer = self.experts[self.trained_experts[0]]  # the (first) trained network
        for name in self.trained_experts:
            network = self.experts[name]
            if cfg.finetune == "lora":
                from diffusers.training_utils import cast_training_params
                from peft import LoraConfig

                lora = LoraConfig(
                    r=cfg.lora_rank,
                    lora_alpha=cfg.lora_alpha,
                    init_lora_weights="gaussian",  # A ~ N(0, 1/r), B = 0: the adapter starts as the identity
                    target_modules=self._lora_targets(),
                )
                network.add_adapter(lora, adapter_name=ADAPTER_NAME)
                cast_training_params(network, torch.float32)  # LoRA weights train in fp32
            else:
                network.requires_grad_(True)
                # save_pretrained imports diffusers.hooks (peft, transformers: seconds) the first time it runs; that
                # first save may be the one a SIGINT/SIGTERM asks for, with seconds to spare: import it now
                import diffusers.hooks  # noqa: F401
            if cfg.gradient_checkpointing:
                network.enable_gradient_checkpointing()
        self._trainable_names = [(name, n) for name in self.trained_experts
                                 for n, p in self.experts[name].named_parameters() if p.requires_grad]
        self.take_reference()

    def take_reference(self) -> None:
        """frozen_copy: copy the trained weights as they are now (at set-up the base model: a new LoRA adapter is
        the identity) as the reference policy. A sharded policy calls it again once its parameters are DTensors,
        before any training or resuming."""
        if self.reference_mode == "frozen_copy":
            self.reference_copy = WeightCopy("reference", self.trainable_parameters(), keep=1.0, follows="never",
                                             saved=False)

    def _lora_targets(self) -> list[str]:
        """The config's LoRA targets; left at the schema default, the family's own (its record's lora_targets)."""
        targets = list(self.config.lora_target_modules)
        return list(FAMILIES[self.config.family].lora_targets) if tuple(targets) == DEFAULT_LORA_TARGETS else targets

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters the optimizer updates: LoRA weights (fp32), or every transformer weight."""
        named = {name: dict(self.experts[name].named_parameters()) for name in self.trained_experts}
        return [named[e][n] for e, n in self._trainable_names]  # looked up by name: survives in-place FSDP2 sharding

    @contextmanager
    def reference(self) -> Iterator[None]:
        """Inside, ``velocity`` is the reference policy, without gradients (LoRA disabled, or a frozen copy)."""
        if self.reference_mode == "none":
            raise RuntimeError(
                "this model was loaded with reference='none', so it has no reference policy; set "
                "model.reference: auto to use a KL term against the base model"
            )
        if self._in_reference:
            raise RuntimeError("reference() contexts do not nest")
        trainable = self.trainable_parameters()
        requires_grad = [p.requires_grad for p in trainable]
        self._in_reference = True
        if self.reference_mode == "adapter_disabled":
            for name in self.trained_experts:
                self.experts[name].disable_adapters()
        swapped = (self.reference_copy.swapped_into(trainable) if self.reference_mode == "frozen_copy"
                   else contextlib.nullcontext())
        try:
            with torch.no_grad(), swapped:
                yield
        finally:
            self._in_reference = False
            if self.reference_mode == "adapter_disabled":
                for name in self.trained_experts:
                    self.experts[name].enable_adapters()
                # peft's enable_adapters sets requires_grad on the adapter; restore what it was
                for p, flag in zip(trainable, requires_grad):
                    p.requires_grad_(flag)

    @contextmanager
    def merged_adapters(self) -> Iterator[None]:
        """Inside, each LoRA layer's adapter is merged into its base weight (``W + (α/r)·B·A``, peft's ``merge``), so
        a network call makes no adapter products (``sampling.merge_lora``: the rollouts); after, every base weight
        is restored exactly from a copy taken before merging (subtracting the product again would not give the same
        bits in bf16) and the adapter is used unmerged again. The adapter's own weights are never written. Without
        gradients; full fine-tuning (no adapter) runs as it is."""
        if self.config.finetune != "lora":
            yield
            return
        from peft.tuners.lora import LoraLayer

        from flowgrpo.models.config import ADAPTER_NAME

        layers = [m for name in self.trained_experts for m in self.experts[name].modules()
                  if isinstance(m, LoraLayer) and ADAPTER_NAME in m.lora_A]
        kept = []
        try:
            with torch.no_grad():
                for layer in layers:
                    weight = layer.get_base_layer().weight
                    kept.append((layer, weight.detach().clone()))
                    layer.merge(adapter_names=[ADAPTER_NAME])
            yield
        finally:
            with torch.no_grad():
                for layer, weight in kept:
                    if layer.merged:
                        layer.unmerge()
                    layer.get_base_layer().weight.copy_(weight)

    def networks(self) -> list[torch.nn.Module]:
        """The networks a sharded run shards: every expert (the trained ones and a frozen one)."""
        return list(self.experts.values())

    def trained_state(self) -> dict[str, torch.Tensor]:
        """What ``save_trainable`` writes, as ``"<expert>.<state-dict name>"``: the LoRA weights, or the whole state
        of each trained expert."""
        state = {}
        names = {(e, n) for e, n in self._trainable_names}
        for expert in self.trained_experts:
            own = self.experts[expert].state_dict()
            state.update({f"{expert}.{n}": t for n, t in own.items() if self.config.finetune == "full" or (expert, n) in names})
        return state

    def _saved_file(self, expert: str) -> Optional[str]:
        """The LoRA file of ``expert`` in a saved folder: diffusers' default name for the first network, a file named
        after the component for the second (loaded with ``load_lora_weights(folder, weight_name=...,
        load_into_transformer_2=True)``), and for full fine-tuning a subfolder per expert beyond the first."""
        return None if expert == next(iter(self.experts)) else f"pytorch_lora_weights_{expert}.safetensors"

    def save_trainable(self, folder: str | os.PathLike, state: Optional[dict[str, torch.Tensor]] = None) -> None:
        """LoRA: diffusers' LoRA file (loads with ``pipe.load_lora_weights``, alpha kept); full: the transformer
        folder (``from_pretrained``). ``state``: ``trained_state()``'s tensors to write instead of the modules' own
        (a sharded run gathers them whole first). A second trained expert (Wan2.2's ``transformer_2``) is written
        beside the first: ``pytorch_lora_weights_transformer_2.safetensors``, or the folder ``transformer_2/``."""
        os.makedirs(folder, exist_ok=True)
        for expert in self.trained_experts:
            own = None if state is None else {k.removeprefix(f"{expert}."): v for k, v in state.items()
                                              if k.startswith(f"{expert}.")}
            self._save_expert(expert, folder, own)

    def _save_expert(self, expert: str, folder: str | os.PathLike, state: Optional[dict[str, torch.Tensor]]) -> None:
        network = self.experts[expert]
        if self.config.finetune == "full":
            if expert != next(iter(self.experts)):
                folder = os.path.join(folder, expert)
            if state is None:
                network.save_pretrained(folder, safe_serialization=True)
                return
            from huggingface_hub import save_torch_state_dict

            network.save_config(folder)
            save_torch_state_dict(state, folder, filename_pattern="diffusion_pytorch_model{suffix}.safetensors",
                                  max_shard_size="10GB")
            return
        from peft.utils import get_peft_model_state_dict

        metadata = network.peft_config[ADAPTER_NAME].to_dict()
        metadata = {k: sorted(v) if isinstance(v, set) else v for k, v in metadata.items()}
        self.pipeline_class.save_lora_weights(
            folder,
            transformer_lora_layers=get_peft_model_state_dict(network, state_dict=state, adapter_name=ADAPTER_NAME),
            transformer_lora_adapter_metadata=metadata,
            safe_serialization=True,
            **({"weight_name": self._saved_file(expert)} if self._saved_file(expert) else {}),
        )

    def load_trainable(self, folder: str | os.PathLike) -> None:
        """Load what ``save_trainable`` wrote, in place (the optimizer's parameters stay the same objects)."""
        for expert in self.trained_experts:
            self._load_expert(expert, folder)

    def _load_expert(self, expert: str, folder: str | os.PathLike) -> None:
        network = self.experts[expert]
        if self.config.finetune == "full":
            from safetensors.torch import load_file

            if expert != next(iter(self.experts)):
                folder = os.path.join(folder, expert)
            files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
            if not files:
                raise FileNotFoundError(f"no *.safetensors transformer weights in {folder}")
            state = {k: v for f in files for k, v in load_file(f).items()}
            network.load_state_dict(state, strict=True)
            return
        from peft.utils import set_peft_model_state_dict

        name = self._saved_file(expert)
        if name is not None and not os.path.isfile(os.path.join(folder, name)):
            raise FileNotFoundError(f"{folder} has no {name}: the LoRA of {expert} (this model trains "
                                    f"{', '.join(self.trained_experts)}; set model.trained_experts to what was saved)")
        state, metadata = self.pipeline_class.lora_state_dict(folder, return_lora_metadata=True,
                                                              **({"weight_name": name} if name else {}))
        prefix = "transformer."  # diffusers' LoRA files prefix keys and metadata with the component name
        metadata = {k.removeprefix(prefix): v for k, v in (metadata or {}).items()}
        for key, want in (("r", self.config.lora_rank), ("lora_alpha", self.config.lora_alpha)):
            got = metadata.get(key)
            if got is None or float(got) != float(want):
                raise ValueError(
                    f"the LoRA in {folder} has {key}={got} but this model has {key}={want}; set model.lora_rank "
                    f"and model.lora_alpha to match the saved adapter (or save it with save_trainable)"
                )
        state = {k.removeprefix(prefix): v for k, v in state.items()}
        result = set_peft_model_state_dict(network, state, adapter_name=ADAPTER_NAME)
        if result.unexpected_keys:
            raise ValueError(f"LoRA in {folder} has weights this model does not: {result.unexpected_keys[:5]}")
        missing = [k for k in result.missing_keys if "lora_" in k]
        if missing:
            raise ValueError(f"LoRA in {folder} lacks weights of this model's adapter: {missing[:5]}")
