"""The family records (flowgrpo/models/families.py): the built-in families' facts agree with their adapters and model
configs, and a user's family registered the same way is a family everywhere a built-in one is."""

from __future__ import annotations

import json

import pytest
import yaml

from flowgrpo.models import FAMILIES, Family, FlowModel, load_model, register_family, validate_model_config
from flowgrpo.models.config import ModelConfigError
from flowgrpo.run.paths import configs_dir


def test_every_model_config_names_a_family_whose_record_matches_its_architecture():
    """Each configs/models/*.yaml's family is registered; a hub model's published components are the ones its record
    lists (fails if a record's components drift from the architecture folder the memory plan reads)."""
    for path in sorted((configs_dir() / "models").glob("*.yaml")):
        family = FAMILIES[yaml.safe_load(path.read_text())["family"]]
        folder = configs_dir() / "models" / "architectures" / path.stem
        if folder.is_dir():
            published = {p.stem for p in folder.glob("*.json")} - {"scheduler", "model_index"}
            assert set(family.components) <= published, (path.stem, family.components, published)
            assert published - set(family.components) <= {"transformer_2"}, (path.stem, published)
            transformer = json.loads((folder / "transformer.json").read_text())  # the transformer's numbers are there
            # the record's class is the published one (context parallelism and the memory plan ask diffusers for it)
            assert transformer["_class_name"] == family.transformer_class, (path.stem, family.transformer_class)


def test_records_are_consistent_and_adapters_import():
    for name, family in FAMILIES.items():
        assert family.name == name
        assert (family.modality == "video") == (family.temporal_factor is not None)
        assert issubclass(family.adapter_class(), FlowModel)


class _UserModel(FlowModel):  # a user's adapter: registered below with a record, as the built-in families are
    pass


def test_a_users_family_is_registered_the_same_way():
    """A video family registered from outside the package: the config check applies its temporal factor and its
    LoRA targets replace the schema default; a bad record is refused."""
    register_family(Family("user_video", _UserModel, modality="video", temporal_factor=8, lora_targets=("proj",)))
    try:
        _check_user_family()
    finally:
        FAMILIES.pop("user_video", None)
    with pytest.raises(ModelConfigError, match="family"):
        load_model({"family": "user_video"})


def _check_user_family():
    record = FAMILIES["user_video"]
    assert record.adapter.endswith(":_UserModel") and record.adapter_class() is _UserModel
    assert validate_model_config({"family": "user_video", "num_frames": 17}).num_frames == 17
    with pytest.raises(ModelConfigError, match=r"8k \+ 1 for 'user_video'"):
        validate_model_config({"family": "user_video", "num_frames": 13})
    from types import SimpleNamespace

    config = validate_model_config({"family": "user_video", "num_frames": 9})
    assert FlowModel._lora_targets(SimpleNamespace(config=config)) == ["proj"]
    with pytest.raises(ValueError, match="temporal_factor"):
        register_family(Family("user_bad", _UserModel, modality="video"))
