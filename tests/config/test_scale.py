"""replicas: {min, max} and scale: in server.yaml: what a model's policy resolves to, and what is refused."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from llmgw.config import load_server_config
from llmgw.config.catalog import Model
from llmgw.config.scale import FIXED_KEYS, SCALE_KEYS, Replicas, Scale
from llmgw.errors import ConfigError

HEAD = """\
listen: {link: "ssl:7443"}
tls: {ca: ca.crt, cert: server.crt, key: server.key}
profiles:
  sim: {engine: sim}
"""


def load(confdir: Path, text: str):
    (confdir / "server.yaml").write_text(text)
    return load_server_config("server.yaml")


def refused(confdir: Path, text: str) -> str:
    (confdir / "server.yaml").write_text(text)
    with pytest.raises(ConfigError) as e:
        load_server_config("server.yaml")
    return str(e.value)


def test_min_below_max_is_elastic_and_equal_is_not():
    assert Scale(min=0, max=2).elastic
    assert not Scale(min=2, max=2).elastic


def test_the_scale_keys_are_scales_fields_but_min_and_max():
    assert SCALE_KEYS == tuple(f.name for f in attrs.fields(Scale))[2:]
    assert set(FIXED_KEYS) <= set(SCALE_KEYS)


# -- what a model's policy resolves to --


def test_an_integer_count_is_min_and_max_with_every_default(confdir: Path) -> None:
    config = load(confdir, HEAD + "models:\n  echo: {profile: sim, replicas: 2}\n  one: {profile: sim}\n")
    assert config.models["echo"].replicas == 2
    assert config.models["echo"].scale == Scale(min=2, max=2)
    assert config.models["one"].scale == Scale(min=1, max=1)
    assert not config.models["echo"].scale.elastic


def test_a_range_keeps_replicas_as_its_max_and_the_min_in_scale(confdir: Path) -> None:
    config = load(confdir, HEAD + "models:\n  qwen: {profile: sim, replicas: {min: 0, max: 3}}\n")
    qwen = config.models["qwen"]
    assert qwen.replicas == 3
    assert (qwen.scale.min, qwen.scale.max, qwen.scale.elastic) == (0, 3, True)
    assert qwen == Model(name="qwen", profile="sim", replicas=Replicas(0, 3))


def test_a_range_of_zero_is_replicas_zero(confdir: Path) -> None:
    ranged = load(confdir, HEAD + "models:\n  m: {profile: sim, replicas: {min: 0, max: 0}}\n").models["m"]
    plain = load(confdir, HEAD + "models:\n  m: {profile: sim, replicas: 0}\n").models["m"]
    assert ranged == plain and plain.replicas == 0 and plain.scale == Scale(min=0, max=0)


def test_the_models_own_keys_win_over_its_profiles_which_win_over_the_defaults(confdir: Path) -> None:
    config = load(confdir, HEAD + """\
  warm: {engine: sim, scale: {idle_s: 300, priority: 5, max_held: 8}}
models:
  qwen:
    profile: warm
    replicas: {min: 0, max: 4}
    scale: {idle_s: 60, target_inflight: 2.5}
""")
    assert config.models["qwen"].scale == Scale(
        min=0, max=4, idle_s=60.0, target_inflight=2.5, priority=5, max_held=8)
    # The profile keeps what it was given; its min and max mean nothing.
    assert config.profiles["warm"].scale == Scale(idle_s=300.0, priority=5, max_held=8)


def test_a_profiles_defaults_are_never_refused_for_a_fixed_model_which_takes_its_priority(confdir: Path) -> None:
    config = load(confdir, HEAD + """\
  warm: {engine: sim, scale: {idle_s: 300, priority: 5}}
models:
  fixed: {profile: warm, replicas: 2}
  pinned: {profile: warm, replicas: 1, scale: {priority: 9}}
""")
    assert config.models["fixed"].scale.priority == 5
    assert config.models["pinned"].scale.priority == 9
    assert not config.models["fixed"].scale.elastic


def test_a_scale_block_from_a_merge_key_counts_as_written(confdir: Path) -> None:
    # Another profile's block, merged into the model's: its keys are the model's own, the model's win.
    config = load(confdir, HEAD + """\
  warm: {engine: sim, scale: &lazy {idle_s: 30, up_after_s: 1}}
models:
  qwen: {profile: sim, replicas: {min: 0, max: 2}, scale: {<<: *lazy, up_after_s: 2}}
""")
    scale = config.models["qwen"].scale
    assert (scale.idle_s, scale.up_after_s) == (30.0, 2.0)


# -- what is refused, with the line and the key --


@pytest.mark.parametrize("models, says", [
    ("  m: {profile: sim, replicas: {min: 3, max: 2}}\n",
     "server.yaml:6: models.m.replicas.min: 3 is more than max (2); min is how many replicas the model always "
     "keeps, max the most it grows to (min 0 lets it sleep; replicas: N is min = max = N)"),
    ("  m: {profile: sim, replicas: {min: -1, max: 2}}\n",
     "server.yaml:6: models.m.replicas.min: must be an integer >= 0, got -1"),
    ("  m: {profile: sim, replicas: {max: 2}}\n",
     "server.yaml:6: models.m.replicas.min: required key is missing; add 'min:' with an integer >= 0"),
    ("  m: {profile: sim, replicas: {min: 0, max: 2, idle: 5}}\n",
     "server.yaml:6: models.m.replicas.idle: unknown key; allowed here: min, max"),
    ("  m: {profile: sim, replicas: [0, 2]}\n",
     "server.yaml:6: models.m.replicas: expected an integer >= 0 or a mapping {min: M, max: X}, got a list"),
    ("  m: {profile: sim, replicas: -2}\n",
     "server.yaml:6: models.m.replicas: must be an integer >= 0, got -2"),
    ("  m: {profile: sim, replicas: {min: 0, max: 2}, scale: {target_inflight: 0}}\n",
     "server.yaml:6: models.m.scale.target_inflight: must be a number > 0, got 0"),
    ("  m: {profile: sim, replicas: {min: 0, max: 2}, scale: {idle_s: 0}}\n",
     "server.yaml:6: models.m.scale.idle_s: must be a number > 0, got 0"),
    ("  m: {profile: sim, replicas: {min: 0, max: 2}, scale: {up_after_s: -1}}\n",
     "server.yaml:6: models.m.scale.up_after_s: must be a number >= 0, got -1"),
    ("  m: {profile: sim, replicas: {min: 0, max: 2}, scale: {max_held: 0}}\n",
     "server.yaml:6: models.m.scale.max_held: must be an integer >= 1, got 0"),
    ("  m: {profile: sim, replicas: {min: 0, max: 2}, scale: {cold_start_timeout_s: 90000}}\n",
     "server.yaml:6: models.m.scale.cold_start_timeout_s: must be at most 86400, got 90000; "
     "a router holds a request a day at most"),
    ("  m: {profile: sim, replicas: {min: 0, max: 2}, scale: {max_held: 1000001}}\n",
     "server.yaml:6: models.m.scale.max_held: must be at most 1000000, got 1000001; "
     "a router holds a million requests of a model at most"),
    ("  m: {profile: sim, replicas: {min: 0, max: 2}, scale: {idel_s: 5}}\n",
     "server.yaml:6: models.m.scale.idel_s: unknown key; did you mean 'idle_s'? allowed here: idle_s, "
     "target_inflight, up_after_s, down_after_s, priority, cold_start_timeout_s, max_held, drain_timeout_s"),
    ("  m: {profile: sim, replicas: 2, scale: {min: 0}}\n",
     "server.yaml:6: models.m.scale.min: min is given in replicas: {min: M, max: X}, beside scale:, not in it"),
    ("  m:\n    profile: sim\n    replicas: 2\n    scale:\n      priority: 3\n      idle_s: 60\n",
     "server.yaml:11: models.m.scale.idle_s: applies only to a model whose count can move, and this one keeps "
     "2 replicas always (min = max = 2); give replicas: {min: M, max: X} with M below X, or remove idle_s "
     "(of scale:, only priority applies to a fixed count)"),
    ("  m: {profile: sim, replicas: {min: 1, max: 1}, scale: {cold_start_timeout_s: 30}}\n",
     "server.yaml:6: models.m.scale.cold_start_timeout_s: applies only to a model whose count can move, and "
     "this one keeps 1 replicas always"),
    ("  m: {profile: sim, scale: {drain_timeout_s: 30}}\n",
     "server.yaml:6: models.m.scale.drain_timeout_s: applies only to a model whose count can move"),
], ids=["min over max", "negative min", "no min", "unknown range key", "a list", "negative count",
        "target zero", "idle zero", "negative up_after", "max_held zero", "hold over a day", "held over a million",
        "typo", "min in scale", "idle on a fixed count", "cold start on min = max", "drain on the default count"])
def test_a_bad_policy_is_refused_naming_the_line_and_the_key(confdir: Path, models: str, says: str) -> None:
    assert refused(confdir, HEAD + "models:\n" + models).startswith(says)


def test_a_profiles_block_is_held_to_the_same_bounds(confdir: Path) -> None:
    text = HEAD + "  warm:\n    engine: sim\n    scale:\n      cold_start_timeout_s: 100000\n"
    assert refused(confdir, text).startswith(
        "server.yaml:8: profiles.warm.scale.cold_start_timeout_s: must be at most 86400, got 100000")
    assert refused(confdir, HEAD + "  warm: {engine: sim, scale: {max: 3}}\n").startswith(
        "server.yaml:5: profiles.warm.scale.max: max is given in replicas: {min: M, max: X}")


# -- a Model made in code --


def test_a_model_made_in_code_keeps_replicas_and_scale_in_agreement() -> None:
    assert Model(name="m", profile="p", replicas=2).scale == Scale(min=2, max=2)
    elastic = Model(name="m", profile="p", replicas=3, scale=Scale(min=0, max=3, idle_s=5.0))
    assert elastic == Model(name="m", profile="p", replicas=Replicas(0, 3), scale=Scale(idle_s=5.0))
    # evolve hands the max back as replicas: the range stays.
    moved = attrs.evolve(elastic, source="/srv/other.gguf")
    assert (moved.replicas, moved.scale.min, moved.scale.max) == (3, 0, 3)
    # A fixed scale follows a new count; an elastic one whose max disagrees is a mistake said at once.
    assert attrs.evolve(Model(name="m", profile="p", replicas=2), replicas=4).scale == Scale(min=4, max=4)
    with pytest.raises(ValueError, match=r"scale's max \(3\) is not replicas \(2\)"):
        attrs.evolve(elastic, replicas=2)
    with pytest.raises(ValueError, match="min 3 is more than max 2"):
        Model(name="m", profile="p", replicas=Replicas(3, 2))
