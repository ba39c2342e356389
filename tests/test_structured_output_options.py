"""Per-request structured-output options vLLM would drop are refused; the rest pass."""

import pytest
from vllm.config import StructuredOutputsConfig
from vllm.sampling_params import SamplingParams, StructuredOutputsParams

from vllm_metal import structured_output_options as options
from vllm_metal.structured_output_options import (DroppedOptionError,
                                                  check_structured_output_options)

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


@pytest.fixture
def server(monkeypatch):
    """Set this process's --structured-outputs-config."""
    def configure(**settings):
        config = type("VllmConfig", (), {
            "structured_outputs_config": StructuredOutputsConfig(**settings)})()
        monkeypatch.setattr(options, "_server_config", None)
        options.remember_server_config(config)
    configure()
    return configure


def _params(backend=None, **kwargs) -> SamplingParams:
    structured = StructuredOutputsParams(**kwargs)
    structured._backend = backend
    return SamplingParams(structured_outputs=structured)


def test_plain_and_ordinary_constraints_pass(server):
    check_structured_output_options(SamplingParams())
    check_structured_output_options(_params(json=SCHEMA))
    check_structured_output_options(_params(regex="a+"))


@pytest.mark.parametrize("option,value,says", [
    ("whitespace_pattern", r"[ ]?", "remove it"),
    ("disable_any_whitespace", True, "--structured-outputs-config"),
])
def test_dropped_option_is_refused_naming_the_fix(server, option, value, says):
    with pytest.raises(DroppedOptionError) as refused:
        check_structured_output_options(_params("xgrammar", json=SCHEMA, **{option: value}))
    assert f"structured_outputs.{option}" in str(refused.value) and says in str(refused.value)
    assert refused.value.parameter == f"structured_outputs.{option}"


def test_server_wide_setting_makes_the_request_option_honoured(server):
    server(backend="xgrammar", disable_any_whitespace=True)
    check_structured_output_options(_params("xgrammar", json=SCHEMA, disable_any_whitespace=True))


def test_additional_properties_already_excluded_by_xgrammar_pass(server):
    """xgrammar's strict mode excludes unnamed properties: the option holds as asked."""
    check_structured_output_options(
        _params("xgrammar", json=SCHEMA, disable_additional_properties=True))


@pytest.mark.parametrize("backend,schema", [
    ("guidance", SCHEMA),
    ("xgrammar", {**SCHEMA, "additionalProperties": True}),
    ("xgrammar", {"type": "object", "properties": {"b": {
        "type": "object", "additionalProperties": {"type": "string"}}}}),
])
def test_additional_properties_the_answer_would_allow_are_refused(server, backend, schema):
    with pytest.raises(DroppedOptionError, match="additionalProperties"):
        check_structured_output_options(
            _params(backend, json=schema, disable_additional_properties=True))
    server(backend="guidance", disable_additional_properties=True)
    check_structured_output_options(
        _params(backend, json=schema, disable_additional_properties=True))
