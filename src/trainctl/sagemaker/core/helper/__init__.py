"""`sagemaker.core.helper` (SDK v3)."""
