"""Request scheduling: bounded priority queues, deadlines, plan choice from live load, batching.

``scheduler_for(model, config, runtime, monitor)`` (in ``factory``) builds a
``ModelScheduler`` for a loaded model; it imports the runtime lazily.
"""

from edge_runtime.scheduler.config import BatchingConfig, ModelConfig, QueueConfig, SchedulerConfig, model_config
from edge_runtime.scheduler.plans import CallablePlan, Plan, model_plans
from edge_runtime.scheduler.policy import REGISTRY as POLICY_REGISTRY
from edge_runtime.scheduler.policy import Decision, DecisionContext, make_policy
from edge_runtime.scheduler.request import InferenceResult
from edge_runtime.scheduler.scheduler import ModelScheduler
from edge_runtime.scheduler.workers import DeviceWorkers, cpu_split

__all__ = ["BatchingConfig", "CallablePlan", "Decision", "DecisionContext", "DeviceWorkers", "InferenceResult",
           "ModelConfig", "ModelScheduler", "POLICY_REGISTRY", "Plan", "QueueConfig", "SchedulerConfig",
           "cpu_split", "make_policy", "model_config", "model_plans"]
