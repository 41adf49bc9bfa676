"""`sagemaker.train` (SageMaker Python SDK v3), run by trainctl: `ModelTrainer` and its
`configs` and `distributed` modules, laid out as SageMaker's (see model_trainer)."""

from trainctl.sagemaker.train import configs, distributed
from trainctl.sagemaker.train.model_trainer import Mode, ModelTrainer

__all__ = ["Mode", "ModelTrainer", "configs", "distributed"]
