"""Edge-cloud: the cloud peer as a fallback, and split execution (head here, tail there).

Modules (import them directly; nothing heavy is imported here):

* ``config``   typed ``[cloud]`` settings, server-wide and per model;
* ``client``   ``CloudClient``, a KServe v2 REST client on aiohttp (own event-loop thread);
* ``breaker``  the circuit breaker; ``network`` RTT/bandwidth estimates (EWMA);
* ``split``    cutting a model (candidate cuts, crossing tensors, head/tail extraction);
* ``choice``   profiling cuts and choosing one (Neurosurgeon's cost model);
* ``manifest`` / ``command``  the ``edge-runtime split`` subcommand;
* ``plans``    ``cloud``, ``split@k`` and ``split`` plans for the scheduler; ``factory`` builds them;
* ``fallback`` the per-model fallback policy and the router that carries it out.
"""
