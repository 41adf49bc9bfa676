"""`sagemaker.modules.distributed` (SDK 2.2xx): trainctl.sagemaker.train.distributed."""

from trainctl.sagemaker.train.distributed import *  # noqa: F403
from trainctl.sagemaker.train.distributed import __all__  # noqa: F401
