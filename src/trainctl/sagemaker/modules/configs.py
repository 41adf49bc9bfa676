"""`sagemaker.modules.configs` (SDK 2.2xx): trainctl.sagemaker.train.configs."""

from trainctl.sagemaker.train.configs import *  # noqa: F403
from trainctl.sagemaker.train.configs import __all__  # noqa: F401
