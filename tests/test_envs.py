from pathlib import Path

from vllm_metal import envs


def test_every_variable_is_documented_in_configuration_md():
    doc = (Path(__file__).parents[1] / "docs" / "configuration.md").read_text()
    for name in envs.VARIABLES:
        assert f"`{name}`" in doc, f"{name} is missing from docs/configuration.md"


def test_defaults_parse():
    for name in envs.VARIABLES:
        getattr(envs, name)
