"""SageMaker's Python SDK for training, run by trainctl: change the import lines only.

    import trainctl.sagemaker as sagemaker                 # import sagemaker
    from trainctl.sagemaker import get_execution_role      # from sagemaker import ...
    from trainctl.sagemaker.pytorch import PyTorch         # from sagemaker.pytorch import ...
    from trainctl.sagemaker.inputs import TrainingInput    # from sagemaker.inputs import ...

    sess = sagemaker.Session()                     # the default bucket is trainctl's store
    role = get_execution_role()                    # the configured instance profile
    inputs = sess.upload_data("data", bucket=sess.default_bucket(), key_prefix="mnist")
    est = PyTorch(entry_point="train.py", source_dir="src", role=role,
                  framework_version="2.5", py_version="py311",   # an image, or the installed torch
                  instance_type="ml.p4d.24xlarge", instance_count=2,   # or "local"
                  distribution={"torch_distributed": {"enabled": True}})
    est.fit({"train": TrainingInput(inputs, distribution="ShardedByS3Key")})
    est.model_data

The modules are laid out as SageMaker's: `session` (Session, get_execution_role), `pytorch`
(PyTorch), `inputs` (TrainingInput), `s3` (S3Uploader, S3Downloader), `local`
(LocalSession), `analytics` (TrainingJobAnalytics). Every argument of SageMaker's PyTorch
estimator is honoured, accepted with one warning, or refused in one line
(trainctl.sagemaker._compat); an argument SageMaker does not have is a TypeError.
"""

from trainctl.sagemaker._compat import SageMakerCompatibilityWarning
from trainctl.sagemaker.analytics import TrainingJobAnalytics
from trainctl.sagemaker.inputs import TrainingInput
from trainctl.sagemaker.pytorch import PyTorch
from trainctl.sagemaker.session import Session, get_execution_role

__all__ = [
    "PyTorch",
    "SageMakerCompatibilityWarning",
    "Session",
    "TrainingInput",
    "TrainingJobAnalytics",
    "get_execution_role",
]
