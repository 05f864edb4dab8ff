"""Where a request runs: the per-model fallback policy, and the router that carries it out.

``FallbackPolicy.route`` decides first (pure, no I/O)::

    mode never                        -> local, always
    model/op not available locally    -> cloud
    breaker open                      -> local (stay local until a probe succeeds)
    mode always / split               -> cloud (split: head here, tail there)
    mode fallback, local estimate > latency_target_ms -> cloud
    otherwise                         -> local

``CloudRouter.infer`` runs the route and handles what goes wrong:

* local queue full (QueueFullError) or local backend failure (BackendError)
  -> the cloud, unless the mode is ``never`` or the breaker is open;
* a cloud failure -> local (a split finishes its tail locally from the head's
  outputs). Only when no local way exists does the cloud's error reach the
  caller (the server answers it with 502).

No request is lost: each ends with outputs or one error. None runs twice
without the caller knowing: ``RoutedResult.ran_twice`` is True when the cloud
may have run it (the request was sent, the answer was lost) and it ran locally too.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping

import numpy as np

from edge_runtime.cloud.breaker import OPEN, CircuitBreaker
from edge_runtime.cloud.client import CloudCallError
from edge_runtime.cloud.config import CloudModelConfig
from edge_runtime.errors import BackendError, BackendUnavailableError, CloudError, QueueFullError

log = logging.getLogger(__name__)

LocalRunner = Callable[[Mapping[str, np.ndarray]], Awaitable[Any]]
LOCAL_FAILURES = (QueueFullError, BackendError, BackendUnavailableError)


@dataclass(frozen=True)
class Route:
    target: str  # "local" or "cloud"
    reason: str


@dataclass(frozen=True)
class RoutedResult:
    """Outputs and where they came from.

    ``ran_on``: ``local``, ``cloud`` or ``split`` (head here, tail in the cloud);
    ``plan``: the plan that produced the outputs (``local``, ``cloud``, ``split@k``);
    ``fallback``: why the first route did not answer (None when it did);
    ``retried``: the cloud call was re-tried after failures that never reached the peer;
    ``ran_twice``: it may have run twice (sent to the cloud, answer lost, then run locally);
    ``local_result``: the local runner's own result (for example the scheduler's
    ``InferenceResult``, with its plan and timings) when the outputs came from it.
    """

    outputs: dict[str, np.ndarray]
    ran_on: str
    plan: str
    reason: str
    fallback: str | None = None
    retried: bool = False
    ran_twice: bool = False
    cloud_attempts: int = 0
    local_result: Any = None


class FallbackPolicy:
    """The decision table of the module docstring, for one model."""

    def __init__(self, config: CloudModelConfig, breaker: CircuitBreaker) -> None:
        self.config = config
        self.breaker = breaker

    def route(self, *, local_available: bool = True, local_estimate_ms: float | None = None) -> Route:
        mode = self.config.mode
        if mode == "never":
            return Route("local", "cloud mode is 'never'")
        if not local_available:
            return Route("cloud", "the model or one of its ops is not available locally")
        if self.breaker.state == OPEN:
            return Route("local", "cloud circuit breaker is open")
        if mode in ("always", "split"):
            return Route("cloud", f"cloud mode is {mode!r}")
        target = self.config.latency_target_ms
        if target and local_estimate_ms is not None and local_estimate_ms > target:
            return Route("cloud", f"local estimate {local_estimate_ms:.1f} ms exceeds the {target:g} ms target")
        return Route("local", "local first (mode 'fallback')")

    def after_local_failure(self, exc: BaseException) -> Route | None:
        """Where a request goes after the local attempt failed with ``exc``; None: nowhere (re-raise)."""
        if self.config.mode == "never" or not isinstance(exc, LOCAL_FAILURES) or isinstance(exc, CloudError):
            return None  # a cloud error from the local side (its own cloud plan) is no reason to call again
        if self.breaker.state == OPEN:
            return None
        what = "local queue full" if isinstance(exc, QueueFullError) else "local backend failed"
        return Route("cloud", f"{what}: {exc}")


class CloudRouter:
    """Runs one model's requests where ``policy`` says, with the fallbacks of the module docstring.

    ``local`` is an async runner (``ModelScheduler.infer``, ``Model.run_async``; a
    result with ``.outputs`` or a plain dict); None when the model cannot run here.
    ``cloud`` is a ``CloudPlan``, ``SplitPlan`` or ``AutoSplitPlan`` (run in a worker
    thread). ``local_estimate_ms`` returns the current local latency estimate, if any.
    """

    def __init__(self, policy: FallbackPolicy, *, local: LocalRunner | None, cloud: Any | None,
                 local_estimate_ms: Callable[[], float | None] = lambda: None) -> None:
        if local is None and cloud is None:
            raise ValueError("a router needs a local runner or a cloud plan")
        self.policy = policy
        self.local = local
        self.cloud = cloud
        self.local_estimate_ms = local_estimate_ms

    async def infer(self, feeds: Mapping[str, np.ndarray], *, request_id: str | None = None,
                    local_options: Mapping[str, Any] | None = None) -> RoutedResult:
        """Outputs of one request; raises the local error, or the cloud's when nothing else can answer.

        ``request_id`` goes with the cloud call; ``local_options`` are keyword arguments for the
        local runner (the scheduler's ``priority``, ``timeout_ms``, ``request_id``).
        """
        call = _Call(feeds, request_id, dict(local_options or {}))
        route = self.policy.route(local_available=self.local is not None,
                                  local_estimate_ms=self.local_estimate_ms())
        if self.cloud is None and route.target == "cloud":
            route = Route("local", f"{route.reason}, but the model has no cloud plan")
        if route.target == "cloud":
            return await self._cloud_first(call, route)
        try:
            return await self._run_local(call, route.reason)
        except LOCAL_FAILURES as exc:
            retry = self.policy.after_local_failure(exc) if self.cloud is not None else None
            if retry is None:
                raise
            log.warning("local run failed (%s); sending the request to the cloud", exc)
            result = await self._run_cloud(call, retry, local_fallback=False)
            return _with(result, fallback=f"local: {exc}")

    async def _run_local(self, call: "_Call", reason: str) -> RoutedResult:
        assert self.local is not None
        result = await self.local(call.feeds, **call.local_options)
        outputs = getattr(result, "outputs", result)
        return RoutedResult(dict(outputs), "local", "local", reason, local_result=result)

    async def _cloud_first(self, call: "_Call", route: Route) -> RoutedResult:
        try:
            return await self._run_cloud(call, route, local_fallback=True)
        except CloudCallError as exc:
            if self.local is None:
                raise
            log.warning("cloud failed (%s); running the request locally", exc)
            result = await self._run_local(call, route.reason)
            return _with(result, fallback=f"cloud: {exc}", retried=exc.attempts > 1, ran_twice=exc.maybe_ran,
                         cloud_attempts=exc.attempts)

    async def _run_cloud(self, call: "_Call", route: Route, *, local_fallback: bool) -> RoutedResult:
        loop = asyncio.get_running_loop()
        feeds, request_id = call.feeds, call.request_id
        if hasattr(self.cloud, "execute"):  # split plans: the tail may finish locally
            split = await loop.run_in_executor(
                None, lambda: self.cloud.execute(feeds, finish_locally=local_fallback, request_id=request_id))
            if split.error is not None:
                return RoutedResult(split.outputs, "local", split.plan, route.reason,
                                    fallback=f"cloud tail: {split.error}", retried=split.error.attempts > 1,
                                    ran_twice=split.ran_twice, cloud_attempts=split.error.attempts)
            assert split.call is not None
            return RoutedResult(split.outputs, "split", split.plan, route.reason, retried=split.call.retried,
                                cloud_attempts=split.call.attempts)
        answered = await loop.run_in_executor(None, self.cloud.call, feeds, request_id)
        return RoutedResult(answered.outputs, "cloud", "cloud", route.reason, retried=answered.retried,
                            cloud_attempts=answered.attempts)


@dataclass(frozen=True)
class _Call:
    """One request as the router passes it along."""

    feeds: Mapping[str, np.ndarray]
    request_id: str | None
    local_options: Mapping[str, Any]


def _with(result: RoutedResult, **changes: Any) -> RoutedResult:
    import dataclasses

    return dataclasses.replace(result, **changes)
