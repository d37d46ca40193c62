"""What pretraining contributes: the same export with an untrained policy (random weights, seed 0)
and with the policy shipped with ncclrl, per preset, top-16 timing and the policy alone; fraction
of the exhaustive optimum in the simulator.

    python docs/results/scripts/pretrain_ablation.py
"""

from sb3_contrib import MaskablePPO

from ncclrl.agents.evaluate import evaluate_table, summary
from ncclrl.agents.export import export_table
from ncclrl.agents.pretrain import load_policy
from ncclrl.costmodel.simulator import Simulator
from ncclrl.costmodel.topology import preset_names
from ncclrl.envs.nccl_env import NcclTuneEnv

untrained = MaskablePPO("MlpPolicy", NcclTuneEnv(backends=["h200-1x4"]), policy_kwargs={"net_arch": [256, 256]},
                        seed=0)
pretrained = load_policy("pretrained")
for t in preset_names():
    sim = Simulator(t)
    for conf in (False, True):
        f = [summary(evaluate_table(export_table(m, sim, tune_conf=conf, top_k=k), sim))["fraction_of_optimum"]
             for m in (untrained, pretrained) for k in (16, 1)]
        print(f"| {t} | {'yes' if conf else 'no'} | " + " | ".join(f"{100 * x:.1f}%" for x in f) + " |", flush=True)
