"""Layered configuration: defaults < ~/.trainctl/config.yaml < TRAINCTL_* environment."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)


def trainctl_home() -> Path:
    return Path(os.environ.get("TRAINCTL_HOME") or Path.home() / ".trainctl").expanduser()


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TRAINCTL_", extra="forbid")

    home: Path = Field(default_factory=trainctl_home)
    store: str = Field(
        default="",
        description="Root URI of the job store (file:// or s3://); default file://HOME/store.",
    )
    max_source_mb: float = Field(default=100.0, gt=0, description="Largest source_dir accepted.")
    log_sync_seconds: float = Field(
        default=1.0, gt=0, description="How often a node agent copies its log to the store."
    )
    lease_seconds: float = Field(
        default=15.0, gt=0, description="A controller lease older than this is stale."
    )
    orphan_timeout_seconds: float = Field(
        default=300.0,
        gt=0,
        description="A node whose controller's lease has been stale this long shuts down.",
    )
    notice_grace_seconds: float = Field(
        default=120.0,
        ge=0,
        description="After an interruption notice, how long workers get to checkpoint.",
    )
    checkpoint_sync_seconds: float = Field(
        default=0.5, gt=0, description="How often a node looks for new checkpoint files."
    )
    heartbeat_seconds: float = Field(default=5.0, gt=0)
    heartbeat_timeout_seconds: float = Field(
        default=60.0, gt=0, description="A node silent this long is considered lost."
    )
    stop_grace_seconds: float = Field(
        default=10.0, ge=0, description="SIGTERM to SIGKILL grace when a job is stopped."
    )
    # Config-file-only sections that later providers read; kept typed here so typos fail.
    pools: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        yaml_file = trainctl_home() / "config.yaml"
        return (
            init_settings,
            env_settings,
            YamlConfigSettingsSource(settings_cls, yaml_file=yaml_file),
        )

    @property
    def store_uri(self) -> str:
        return self.store or (self.home / "store").resolve().as_uri()


@lru_cache(maxsize=8)
def _cached(home: str, env_key: tuple[tuple[str, str], ...]) -> Settings:
    return Settings()


def get_settings() -> Settings:
    """Settings for the current environment (re-read when TRAINCTL_* variables change)."""
    env_key = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("TRAINCTL_")))
    return _cached(str(trainctl_home()), env_key)
