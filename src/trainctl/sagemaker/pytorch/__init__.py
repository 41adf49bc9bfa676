"""`sagemaker.pytorch`: the PyTorch estimator."""

from trainctl.sagemaker.pytorch.estimator import PyTorch

__all__ = ["PyTorch"]
