"""`sagemaker.inputs.TrainingInput`: trainctl's, which takes SageMaker's arguments."""

from trainctl.estimator.inputs import TrainingInput

__all__ = ["TrainingInput"]
