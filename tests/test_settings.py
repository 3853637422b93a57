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
                          shutdown_timeout=7.0)
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
