"""``/metrics`` families of the generative models, read at scrape time.

| metric | meaning |
|---|---|
| edge_runtime_prefix_cache_lookups_total{model} / _hits_total | prompts looked up / that reused cached KV |
| edge_runtime_prefix_cache_saved_tokens_total{model} | prompt tokens not prefilled thanks to the cache |
| edge_runtime_prefix_cache_bytes{model}, edge_runtime_prefix_cache_budget_bytes{model} | KV kept / allowed |
| edge_runtime_prefix_cache_evicted_blocks_total{model} | blocks dropped by the LRU |
| edge_runtime_prefix_cache_disk_{read,written,dropped}_blocks_total{model} | with ``prefix_cache_disk_bytes``: blocks read back from disk, written, not queued (the writer's queue full) |
| edge_runtime_prefix_cache_disk_bytes{model}, edge_runtime_prefix_cache_disk_budget_bytes{model} | block files kept / allowed |
| edge_runtime_generation_sequences{model,state} | sequences queued, prefilling, running now |
| edge_runtime_generation_tokens_total{model,kind} | tokens generated (``decode``) and prompt tokens run (``prefill``) |
| edge_runtime_generation_kv_cache_bytes{model} | the decode batch's preallocated KV buffers (charged to the memory budget with the prefix cache's budget) |
| edge_runtime_image_preprocess_seconds{model} | histogram: a request's image decode + preprocess time (vision-language models) |
| edge_runtime_vision_encode_seconds{model} | histogram: a request's vision-encoder time (encode, embed, splice) |
| edge_runtime_images_total{model}, edge_runtime_image_tokens_total{model} | images read, and the prompt tokens they became |
| edge_runtime_image_feature_cache_hits_total{model} / _misses_total | images whose encoder output was reused / encoded (the cache on) |
| edge_runtime_image_feature_cache_bytes{model}, edge_runtime_image_feature_cache_budget_bytes{model} | feature rows kept / allowed |
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

if TYPE_CHECKING:
    from edge_runtime.serving.repository import ModelRepository


class GenerationCollector:
    def __init__(self, repository: "ModelRepository") -> None:
        self._repository = repository

    def collect(self) -> Iterable[Metric]:
        from edge_runtime.serving.generation_serving import GenerationDispatcher

        models = {v.name: v.model for v in self._repository.served() if isinstance(v.dispatcher, GenerationDispatcher)}
        counters = {name: CounterMetricFamily(f"edge_runtime_prefix_cache_{name}", doc, labels=("model",))
                    for name, doc in (("lookups", "Prompts looked up in the prefix cache"),
                                      ("hits", "Prompts that reused cached KV"),
                                      ("saved_tokens", "Prompt tokens whose prefill the prefix cache saved"),
                                      ("evicted_blocks", "Prefix cache blocks evicted (LRU)"))}
        gauges = {name: GaugeMetricFamily(f"edge_runtime_prefix_cache_{name}", doc, labels=("model",))
                  for name, doc in (("bytes", "KV bytes held by the prefix cache"),
                                    ("budget_bytes", "Byte budget of the prefix cache"))}
        disk = {name: family(f"edge_runtime_prefix_cache_disk_{name}", doc, labels=("model",))
                for name, family, doc in (
                    ("read_blocks", CounterMetricFamily, "Prefix cache blocks read back from disk"),
                    ("written_blocks", CounterMetricFamily, "Prefix cache blocks written to disk"),
                    ("dropped_blocks", CounterMetricFamily, "Prefix cache blocks not written (writer queue full)"),
                    ("bytes", GaugeMetricFamily, "Bytes of prefix cache block files on disk"),
                    ("budget_bytes", GaugeMetricFamily, "Byte budget of the prefix cache's files on disk"))}
        sequences = GaugeMetricFamily("edge_runtime_generation_sequences", "Sequences by state",
                                      labels=("model", "state"))
        tokens = CounterMetricFamily("edge_runtime_generation_tokens", "Tokens run, by kind",
                                     labels=("model", "kind"))
        kv = GaugeMetricFamily("edge_runtime_generation_kv_cache_bytes", "Bytes of the preallocated KV buffers",
                               labels=("model",))
        preprocess = HistogramMetricFamily("edge_runtime_image_preprocess_seconds",
                                           "Image decode + preprocess time per request", labels=("model",))
        encode = HistogramMetricFamily("edge_runtime_vision_encode_seconds", "Vision encoder time per request",
                                       labels=("model",))
        images = CounterMetricFamily("edge_runtime_images", "Images read by the model", labels=("model",))
        image_tokens = CounterMetricFamily("edge_runtime_image_tokens", "Prompt tokens the images became",
                                           labels=("model",))
        feature_cache = {name: family(f"edge_runtime_image_feature_cache_{name}", doc, labels=("model",))
                         for name, family, doc in (
                             ("hits", CounterMetricFamily, "Images whose vision-encoder output was reused"),
                             ("misses", CounterMetricFamily, "Images encoded while the feature cache was on"),
                             ("bytes", GaugeMetricFamily, "Bytes of image features the cache holds"),
                             ("budget_bytes", GaugeMetricFamily, "Byte budget of the image feature cache"))}
        for name, model in sorted(models.items()):
            stats = getattr(model, "vision_stats", None)
            if stats is not None and model.is_multimodal:
                pre, enc, count, tokens_of_images = stats.snapshot()
                for family, snap in ((preprocess, pre), (encode, enc)):
                    family.add_metric([name], [(_bound(b), c) for b, c in snap.buckets], snap.total_s)
                images.add_metric([name], count)
                image_tokens.add_metric([name], tokens_of_images)
            features = getattr(model.prompter, "features", None)  # onnxruntime-genai VLMs encode inside genai
            if features is not None:
                held = features.stats()
                for key, value in (("hits", held.hits), ("misses", held.misses), ("bytes", held.bytes),
                                   ("budget_bytes", held.budget_bytes)):
                    feature_cache[key].add_metric([name], value)

            cache = model.prefix_cache.stats()
            for key, value in (("lookups", cache.lookups), ("hits", cache.hits), ("saved_tokens", cache.hit_tokens),
                               ("evicted_blocks", cache.evicted_blocks)):
                counters[key].add_metric([name], value)
            gauges["bytes"].add_metric([name], cache.bytes)
            gauges["budget_bytes"].add_metric([name], cache.budget_bytes)
            if model.prefix_cache.store is not None:
                for key, value in model.prefix_cache.store.stats().items():
                    if key in disk:
                        disk[key].add_metric([name], value)
            batch = model.batcher.stats()
            for state, count in (("queued", batch.queued), ("prefilling", batch.prefilling),
                                 ("running", batch.running)):
                sequences.add_metric([name, state], count)
            tokens.add_metric([name, "decode"], batch.tokens_generated)
            tokens.add_metric([name, "prefill"], batch.prefill_tokens)
            kv.add_metric([name], model.kv_cache_bytes)
        yield from (*counters.values(), *gauges.values(), *disk.values(), sequences, tokens, kv, preprocess, encode, images,
                    image_tokens, *feature_cache.values())


def _bound(value: float) -> str:
    return "+Inf" if value == float("inf") else repr(value)
