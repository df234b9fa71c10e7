"""GCU runner: device "gcu:<id>" through the paddle-custom-gcu plug-in.

Not run on hardware yet (no GCU host reachable). The cache is sized from the device's free memory
after the weights are loaded, scaled by `gcu_memory_fraction` is not yet a setting: today it uses
kv_cache_memory_bytes like the CPU runner unless num_kv_blocks is given.
"""

from __future__ import annotations

import paddle

from paddle_llm_engine.platforms import check_gcu_versions
from paddle_llm_engine.runner.base import ModelRunnerBase


class GCUModelRunner(ModelRunnerBase):
    def setup_device(self) -> None:
        check_gcu_versions()
        paddle.set_device(self.device)  # "gcu:<id>", registered by the plug-in
