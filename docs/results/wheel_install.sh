#!/usr/bin/env bash
# A user's first steps from a non-editable install: build the wheel, install it into a fresh venv,
# and from an empty folder run ncclrl --version, ncclrl plugin build, a short ncclrl pretrain and
# gym.make; list what the install put into site-packages. Writes the transcript to stdout.
#   bash docs/results/wheel_install.sh > docs/results/wheel-install.txt
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() { printf '$ %s\n' "$*"; "$@" 2>&1; echo; }
cd "$work"
python3 -m venv venv >/dev/null
. venv/bin/activate
pip install -q --disable-pip-version-check torch==2.13.0 >/dev/null 2>&1
before=$(ls venv/lib/python3*/site-packages | sort)
printf '$ pip install %s   # (not editable; torch==2.13.0 installed first)\n' "<repo>"
pip install -q --disable-pip-version-check "$repo" 2>&1 | grep -v "^WARNING: " || true
echo
mkdir empty && cd empty
echo "# site-packages entries the install added (dependencies and ncclrl):"
comm -13 <(echo "$before") <(ls ../venv/lib/python3*/site-packages | sort) | grep -viE '^(__pycache__)$' | tr '\n' ' '
echo; echo
echo "# ncclrl's own files: the top-level names its RECORD puts into site-packages, and its scripts"
python - <<'PY'
from importlib.metadata import distribution
files = distribution("ncclrl").files
print("site-packages:", sorted({f.parts[0] for f in files if f.parts[0] != ".."}))
print("scripts:", sorted(f.name for f in files if f.parts[0] == ".."))
PY
echo
run ncclrl --version
export NCCLRL_PLUGIN_DIR=$PWD/plugin
run ncclrl plugin build
run ls -la "$NCCLRL_PLUGIN_DIR"
printf '$ %s\n' "ncclrl pretrain agent.total_timesteps=1024 agent.n_envs=2 agent.n_steps=256 agent.batch_size=256 experiment.families=[socket] check_platforms=2 run_dir=run"
NCCLRL_PROGRESS=0 ncclrl pretrain agent.total_timesteps=1024 agent.n_envs=2 agent.n_steps=256 agent.batch_size=256 \
  'experiment.families=[socket]' check_platforms=2 run_dir=run 2>&1 | sed -E 's/[0-9]+\.[0-9]+ (s|min)/<time>/g'
echo
run ls run run/table
printf '$ %s\n' "python -c 'import ncclrl, gymnasium as gym; env = gym.make(\"ncclrl/NcclTune-v0\"); ...'"
python - <<'PY'
import gymnasium as gym
import ncclrl

env = gym.make("ncclrl/NcclTune-v0")
obs, info = env.reset(seed=0)
mask = env.unwrapped.action_masks()
obs, reward, terminated, truncated, info = env.step(int(mask.nonzero()[0][0]))
print(f"ncclrl {ncclrl.__version__} from {ncclrl.__file__}")
print(f"{env.spec.id}: observation {obs.shape}, {env.action_space.n} actions, reward {reward:.3f}, "
      f"terminated={terminated}")
PY
echo
printf '$ %s\n' "ncclrl show run/table/nccl_tuner.csv | head -5"
ncclrl show run/table/nccl_tuner.csv | head -5
