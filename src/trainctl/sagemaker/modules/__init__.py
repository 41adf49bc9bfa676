"""`sagemaker.modules` (SageMaker Python SDK 2.2xx): where ModelTrainer lived before v3."""
