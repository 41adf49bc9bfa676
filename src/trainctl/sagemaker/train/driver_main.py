"""The entry point of a ModelTrainer job whose `distributed` is a driver of the user's own
(a DistributedConfig subclass naming `driver_dir` and `driver_script`): on each node it runs
that driver as SageMaker's container does. The source code is the `code` channel
(SM_SOURCE_DIR, the working directory), the driver the `sm_drivers` channel's
distributed_drivers/ (SM_DISTRIBUTED_DRIVER_DIR); SM_ENTRY_SCRIPT names the entry script and
SM_DISTRIBUTED_CONFIG holds the config's fields. Copied next to sm_driver.json into the
job's source (trainctl.sagemaker.train.model_trainer): standard library only, as it runs in
the job's Python."""

import json
import os
import sys


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "sm_driver.json")) as f:
        config = json.load(f)
    source = os.environ["SM_CHANNEL_CODE"]
    drivers = os.path.join(os.environ["SM_CHANNEL_SM_DRIVERS"], "distributed_drivers")
    env = {
        **os.environ,
        "SM_SOURCE_DIR": source,
        "SM_DISTRIBUTED_DRIVER_DIR": drivers,
        "SM_ENTRY_SCRIPT": config["entry_script"],
        "SM_DISTRIBUTED_CONFIG": json.dumps(config["distributed"]),
    }
    os.chdir(source)
    script = os.path.join(drivers, config["driver_script"])
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, script], env)


if __name__ == "__main__":
    main()
