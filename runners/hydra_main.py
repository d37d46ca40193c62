"""A thin ``@hydra.main`` around :func:`runners.pretrain.train`, for Hydra's own features
(multirun sweeps, its output folders):

    python -m runners.hydra_main -m seed=0,1,2 topology=h200-1x4,dgx-h100-2n

Each run writes into Hydra's output folder. ``ncclrl pretrain`` composes the same configuration.
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from runners.pretrain import train


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float:
    with open_dict(cfg):
        if not cfg.get("run_dir"):
            cfg.run_dir = HydraConfig.get().runtime.output_dir
    result = train(cfg)
    return float(result["summary"]["geomean_speedup"])


if __name__ == "__main__":
    main()
