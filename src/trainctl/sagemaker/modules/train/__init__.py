"""`sagemaker.modules.train` (SDK 2.2xx): the same ModelTrainer as trainctl.sagemaker.train."""

from trainctl.sagemaker.train import Mode, ModelTrainer

__all__ = ["Mode", "ModelTrainer"]
