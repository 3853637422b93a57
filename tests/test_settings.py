"""The one worker settings object: environment variables, CLI options and defaults agree."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import typer

import stream_app.settings as settings_mod
from stream_app.settings import SettingsError, WorkerSettings, setting_specs

REQUIRED = {"campaign_paths": (Path("a.toml"),), "kafka_bootstrap": "k:9092", "redis_url": "redis://r:6379/0"}


def test_defaults_and_required():
    s = WorkerSettings(**REQUIRED)
    assert (s.app_id, s.partitions, s.refresh_seconds, s.session_timeout, s.web_port) == ("ldp-stream", 4, 1.0, 10.0,
                                                                                          None)
    with pytest.raises(SettingsError, match="LDP_KAFKA_BOOTSTRAP"):
        WorkerSettings.from_env({}, campaign_paths=["a.toml"], redis_url="redis://r")
    with pytest.raises(SettingsError, match="partitions"):
        WorkerSettings(**REQUIRED, partitions=0)


def test_environment_round_trip_and_precedence():
    full = WorkerSettings(**REQUIRED, app_id="g", partitions=8, topic_prefix="p.", refresh_seconds=0.25,
                          session_timeout=3.0, web_port=6066, web_host="h", web_bind="0.0.0.0", data_dir=Path("d"),
                          ready_file=Path("r.json"), loglevel="info", logfile=Path("w.log"),
                          stream_buffer_maxsize=32, consumer_max_fetch_size=1 << 20, consumer_fetch_max_wait=0.5,
                          shutdown_timeout=7.0, per_value_metrics=True, per_value_metrics_max_k=50,
                          redis_memory_bytes=1 << 30, retention_batches_per_step=7)
    env = full.to_env()
    assert set(env) == {spec["env"] for spec in setting_specs().values()}
    assert WorkerSettings.from_env(env) == full
    # an option given beats the variable; None means "not given"; an empty variable is unset
    assert WorkerSettings.from_env(env, partitions=2, app_id=None).partitions == 2
    assert WorkerSettings.from_env(env, partitions=2, app_id=None).app_id == "g"
    assert WorkerSettings.from_env({**env, "LDP_APP_ID": ""}).app_id == "ldp-stream"
    two = WorkerSettings.from_env({**env, "LDP_CAMPAIGNS": "a.toml" + os.pathsep + "b.toml"})
    assert two.campaign_paths == (Path("a.toml"), Path("b.toml"))
    with pytest.raises(SettingsError, match="LDP_PARTITIONS"):
        WorkerSettings.from_env({**env, "LDP_PARTITIONS": "many"})
    with pytest.raises(TypeError):
        WorkerSettings.merge({"no_such_setting": 1}, {})


def test_every_setting_is_documented_and_is_an_ldp_worker_option():
    from ldpstream_cli.cli import app

    doc = settings_mod.__doc__
    cmd = typer.main.get_command(app).commands["worker"]  # type: ignore[attr-defined]
    options = {p.name: tuple(p.opts) for p in cmd.params if p.name != "help"}
    specs = setting_specs()
    assert set(options) == set(specs)
    for name, spec in specs.items():
        assert f"``{name}``" in doc and f"``{spec['env']}``" in doc, name
        assert options[name] == spec["option"], name


def test_flags_and_memory_sizes():
    """``LDP_PER_VALUE_METRICS`` takes true/false words; ``LDP_REDIS_MEMORY_BYTES`` bytes or Redis's units."""
    env = {"LDP_CAMPAIGNS": "a.toml", "LDP_KAFKA_BOOTSTRAP": "k:9092", "LDP_REDIS_URL": "redis://r"}
    s = WorkerSettings.from_env(env)
    assert (s.per_value_metrics, s.redis_memory_bytes, s.retention_batches_per_step) == (False, None, 100)
    for word, value in (("yes", True), ("ON", True), ("1", True), ("false", False), ("0", False)):
        assert WorkerSettings.from_env({**env, "LDP_PER_VALUE_METRICS": word}).per_value_metrics is value
    with pytest.raises(SettingsError, match="LDP_PER_VALUE_METRICS"):
        WorkerSettings.from_env({**env, "LDP_PER_VALUE_METRICS": "maybe"})
    for text, size in (("268435456", 268435456), ("512mb", 512 << 20), ("2gb", 2 << 30), ("1g", 10 ** 9),
                       ("64kb", 65536)):
        assert settings_mod.parse_memory(text) == size
        assert WorkerSettings.from_env({**env, "LDP_REDIS_MEMORY_BYTES": text}).redis_memory_bytes == size
    with pytest.raises(SettingsError, match="LDP_REDIS_MEMORY_BYTES"):
        WorkerSettings.from_env({**env, "LDP_REDIS_MEMORY_BYTES": "lots"})
    with pytest.raises(SettingsError, match="retention_batches_per_step"):
        WorkerSettings(**REQUIRED, retention_batches_per_step=0)
