"""`sagemaker.core` (SDK v3): its session helper (helper.session_helper: Session,
get_execution_role), `image_uris` and the tuner's `parameter` ranges."""

from trainctl.sagemaker.core import image_uris, parameter

__all__ = ["image_uris", "parameter"]
