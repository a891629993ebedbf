"""One frozen pydantic `TrainOptions` in configs: the scenario's `training:` knobs plus the run's pipeline clock,
the same class for the scenario loader and the training step model."""

from __future__ import annotations

import pickle

import pytest
from pydantic import ValidationError

from k3sim.configs.loaders import validate
from k3sim.configs.planning import TrainingSection, TrainOptions
from k3sim.errors import InputError


def test_the_training_package_uses_the_configs_class():
    import k3sim.training
    import k3sim.training.step

    assert k3sim.training.TrainOptions is TrainOptions is k3sim.training.step.TrainOptions


def test_every_scenario_knob_is_an_option_with_the_same_default():
    """One definition: the options are the section's fields plus the pipeline clock, nothing re-typed."""
    section, options = TrainingSection.model_fields, TrainOptions.model_fields
    assert set(options) - set(section) == {"use_pipeline_engine"}
    for name, f in section.items():
        assert options[name].default == f.default and options[name].annotation == f.annotation, name


@pytest.mark.parametrize("knobs, engine", [({}, None), ({"tp_overlap": 0.5, "seed": 3}, False),
                                          ({"moe_glue": "proxy", "kda_cp": "lasp2"}, True)])
def test_a_section_becomes_options_with_its_values(knobs, engine):
    opts = TrainingSection(**knobs).options(engine)
    assert isinstance(opts, TrainOptions) and opts.use_pipeline_engine is engine
    assert {k: getattr(opts, k) for k in knobs} == knobs


@pytest.mark.parametrize("knobs", [{}, {"routing_skew": 1.2, "redundant_experts": 4}, {"mla_cp": "ring"}])
def test_options_are_frozen_hashable_and_picklable(knobs):
    """A memo key (sweep workers pickle them): equal options hash equal, and nothing can change one in place."""
    a, b = TrainOptions(**knobs), TrainOptions(**knobs)
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    assert pickle.loads(pickle.dumps(a)) == a
    with pytest.raises(ValidationError, match="frozen"):
        a.tp_overlap = 0.3


@pytest.mark.parametrize("knobs, field", [({"tp_overlap": 1.5}, "tp_overlap"), ({"ep_overlap": -0.1}, "ep_overlap"),
                                          ({"routing_skew": float("nan")}, "routing_skew"),
                                          ({"redundant_experts": -1}, "redundant_experts"),
                                          ({"moe_glue": "unfused"}, "moe_glue"), ({"kda_cp": "ring"}, "kda_cp"),
                                          ({"bogus": 1}, "bogus")])
def test_a_bad_option_built_in_python_is_an_input_error_naming_its_field(knobs, field):
    with pytest.raises(InputError) as err:
        TrainOptions(**knobs)
    assert err.value.field == field


def test_a_scenario_cannot_set_the_pipeline_clock():
    """The caller chooses the clock (plan: the engine, sweep: the closed form); a scenario field would be ignored."""
    with pytest.raises(InputError) as err:
        validate(TrainingSection, {"use_pipeline_engine": True}, "scenario.yaml")
    assert err.value.field == "use_pipeline_engine" and "unknown field" in err.value.reason
