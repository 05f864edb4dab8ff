"""Request scheduling: bounded priority queues, deadlines, plan choice, batching."""

from edge_runtime.scheduler.config import BatchingConfig, ModelConfig, QueueConfig, SchedulerConfig, model_config
from edge_runtime.scheduler.request import InferenceResult
from edge_runtime.scheduler.scheduler import ModelScheduler, model_plans

__all__ = ["BatchingConfig", "InferenceResult", "ModelConfig", "ModelScheduler", "QueueConfig",
           "SchedulerConfig", "model_config", "model_plans"]
