"""`sagemaker.core.image_uris` (SDK v3): `retrieve` names SageMaker's PyTorch training images
(trainctl.sagemaker.images: what a job does with one where it cannot be had)."""

from trainctl.sagemaker.images import retrieve

__all__ = ["retrieve"]
