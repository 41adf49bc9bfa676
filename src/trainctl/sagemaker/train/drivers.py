"""A ModelTrainer's distributed driver of the user's own (a DistributedConfig subclass with
`driver_dir` and `driver_script`), staged as SageMaker stages it: the source code goes as
the `code` channel, the driver's folder as the `sm_drivers` channel's distributed_drivers/,
and the job's entry point is driver_main, which runs the driver on each node with
SageMaker's variables (see there)."""

from __future__ import annotations

import json
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainctl.errors import SpecError

ENTRY_POINT = "sm_driver.py"
CHANNELS = ("code", "sm_drivers")


@dataclass(frozen=True)
class StagedDriver:
    """The job's source (driver_main and its config) and the two channels' folders."""

    source_dir: Path
    code: Path
    drivers: Path


def stage_driver(
    owner: object, distributed: Any, source_dir: str, entry_script: str
) -> StagedDriver:
    """The staged driver of `distributed` (removed with `owner`); bad input: SpecError."""
    folder = Path(str(distributed.driver_dir or ""))
    script = str(distributed.driver_script or "")
    if not folder.is_dir():
        raise SpecError("distributed.driver_dir", f"{str(folder)!r} is not a folder")
    if not script or not (folder / script).is_file():
        raise SpecError("distributed.driver_script", f"{script!r} is not a file in {str(folder)!r}")
    staged = Path(tempfile.mkdtemp(prefix="trainctl-driver-"))
    weakref.finalize(owner, shutil.rmtree, staged, True)
    source = staged / "source"
    source.mkdir()
    shutil.copy(Path(__file__).with_name("driver_main.py"), source / ENTRY_POINT)
    config = {
        "entry_script": entry_script,
        "driver_script": script,
        "distributed": distributed.model_dump(mode="json"),
    }
    (source / "sm_driver.json").write_text(json.dumps(config))
    drivers = staged / "sm_drivers"
    shutil.copytree(folder, drivers / "distributed_drivers")
    return StagedDriver(source, Path(source_dir), drivers)
