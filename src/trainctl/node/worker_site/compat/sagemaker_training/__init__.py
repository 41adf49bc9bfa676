"""trainctl's stand-in for SageMaker's training toolkit (`sagemaker_training`), importable in
a job's processes where the real package is not installed: its `environment.Environment`,
which many SageMaker scripts read, made from the SM_* variables every trainctl node sets."""
