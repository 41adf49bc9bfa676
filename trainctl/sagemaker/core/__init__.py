"""`sagemaker.core` (SDK v3): its session helper (see helper.session_helper)."""
