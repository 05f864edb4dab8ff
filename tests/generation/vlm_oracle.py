"""The no-cache greedy oracle of the VLM engine tests (see ``test_vlm_engine``'s docstring)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np


class Oracle:
    """No-cache greedy recompute over the folder's graphs (see the module docstring)."""

    def __init__(self, model) -> None:
        import onnxruntime as ort

        vlm = model.vlm
        self.vlm = vlm
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.embed = ort.InferenceSession(str(vlm.embed_path), options, providers=["CPUExecutionProvider"])
        self.vision = ort.InferenceSession(str(vlm.vision_path), options, providers=["CPUExecutionProvider"])
        self.decoder = ort.InferenceSession(str(vlm.decoder.model_path), options, providers=["CPUExecutionProvider"])

    def features(self, processed) -> np.ndarray:
        names = {i.name for i in self.vision.get_inputs()}
        feeds = {k: v for k, v in processed.feeds.items() if k in names}
        return self.vision.run(["image_features"], feeds)[0].reshape(-1, self.vlm.hidden_size)

    def positions(self, ids: list[int], grids: list) -> np.ndarray:
        """Decoder position_ids of ``ids``: the family's own transformers ``get_rope_index`` (M-RoPE)."""
        import torch
        from transformers.models.glm4v.modeling_glm4v import Glm4vModel
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel

        if not self.vlm.mrope:
            return np.arange(len(ids), dtype=np.int64)[None]
        vision = self.vlm.config.get("vision_config", {})
        config = SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=self.vlm.spatial_merge_size,
                                                               tokens_per_second=vision.get("tokens_per_second", 2)),
                                 image_token_id=self.vlm.image_token_id, video_token_id=-5,
                                 vision_start_token_id=self.vlm.vision_start_token_id,
                                 video_start_token_id=-6, video_end_token_id=-7)
        owner = SimpleNamespace(config=config)
        grid = torch.tensor(grids) if grids else None
        if self.vlm.family == "glm4v":
            positions, _ = Glm4vModel.get_rope_index(owner, torch.tensor([ids]), grid, None, None)
        elif self.vlm.family == "qwen2_5_vl":
            positions, _ = Qwen2_5_VLModel.get_rope_index(owner, torch.tensor([ids]), grid, None, None, None)
        elif self.vlm.family == "qwen3_vl":
            from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel

            positions, _ = Qwen3VLModel.get_rope_index(owner, torch.tensor([ids]), grid, None, None)
        else:
            positions, _ = Qwen2VLModel.get_rope_index(owner, torch.tensor([ids]), grid, None, None)
        return positions.numpy()

    def greedy(self, ids: list[int], processed: list, steps: int) -> list[int]:
        layout = self.vlm.decoder.kv
        rows = np.concatenate([self.features(p) for p in processed]) if processed else None
        grids = [list(p.grid_thw) for p in processed if p.grid_thw is not None]
        tokens, out = list(ids), []
        for _ in range(steps):
            embeds = self.embed.run(["inputs_embeds"], {"input_ids": np.array([tokens], np.int64)})[0]
            if rows is not None:
                embeds[0, np.array(tokens) == self.vlm.image_token_id] = rows
            feeds = {"inputs_embeds": embeds, "attention_mask": np.ones((1, len(tokens)), np.int64),
                     "position_ids": self.positions(tokens, grids)}
            for i in range(layout.layers):
                for kind in ("key", "value"):
                    feeds[f"past_key_values.{i}.{kind}"] = np.zeros((1, layout.kv_heads, 0, layout.head_dim),
                                                                    layout.dtype)
            token = int(np.argmax(self.decoder.run(["logits"], feeds)[0][0, -1]))
            out.append(token)
            tokens.append(token)
        return out
