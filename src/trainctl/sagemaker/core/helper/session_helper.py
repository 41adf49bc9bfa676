"""`sagemaker.core.helper.session_helper` (SDK v3): `Session` and `get_execution_role`,
trainctl.sagemaker's (the default bucket is trainctl's store; the role, the configured
instance profile)."""

from trainctl.sagemaker.session import Session, get_execution_role

__all__ = ["Session", "get_execution_role"]
