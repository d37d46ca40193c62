#!/usr/bin/env bash
# A user's first steps from a non-editable install, on a machine without GPUs: build the wheel,
# install it into a fresh venv, and from an empty folder run every command ``ncclrl --help`` lists
# (and each one's --help) on the user's own files: recordings of this repository under data/ (a
# PyTorch trace from tests/data/), copied into the folder first. The commands that need GPUs (sweep, plugin verify) must
# answer with one line and exit 2. Writes the transcript to stdout, a summary table at its end.
# Exits non-zero when a command ends otherwise than expected or prints a Python traceback.
#   bash docs/results/wheel_install.sh > docs/results/wheel-install.txt
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
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
export NCCLRL_PROGRESS=0 CUDA_VISIBLE_DEVICES=""  # no GPU, as on a user's laptop
export NCCLRL_PLUGIN_DIR=$PWD/plugin

summary=()
failed=()
# step LABEL EXPECT MAXLINES COMMAND: print the command, its output (times as <time>, the temporary
# folder as <tmp>; at most MAXLINES lines: the first and the last ones) and its exit code
step() {
  local label=$1 expect=$2 max=$3 cmd=$4 out="$work/out.txt" t0 t1 rc n
  printf '$ %s\n' "$cmd"
  t0=$(date +%s.%N)
  eval "$cmd" >"$out" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  sed -i -E -e 's/[0-9]+\.[0-9]+ (s|min)/<time>/g' -e "s#$work#<tmp>#g" "$out"
  n=$(wc -l <"$out")
  if (( n > max )); then
    head -n $(( max - max / 3 )) "$out"
    echo "    [... $(( n - max )) lines left out ...]"
    tail -n $(( max / 3 )) "$out"
  else
    cat "$out"
  fi
  echo "(exit $rc)"
  echo
  if (( rc != expect )); then
    failed+=("$label: exit $rc, expected $expect")
  fi
  if grep -q "Traceback (most recent call last)" "$out"; then
    failed+=("$label: printed a Python traceback")
  fi
  summary+=("$(printf '%-22s %4s %7.0f' "$label" "$rc" "$(echo "$t1 - $t0" | bc)")")
}

# the user's own files, copied from the repository's recordings
mkdir -p logs reqlog loopback
cp "$repo"/data/h200x2-2026-11-22/run1/nccl-info/*.log logs/
cp "$repo"/data/h100x1-jobs-2026-11-24/second-run/reqlog/*.csv reqlog/  # one-rank jobs: 0 requests
mkdir -p trace && cp "$repo"/tests/data/profiles/ddp-rank0.trace.json.gz trace/  # a DDP job's PyTorch trace
cp "$repo"/data/h100x1-loopback-2026-11-25/part4/store.sqlite loopback/store.sqlite
cp "$repo"/data/h100x1-loopback-2026-11-25/part4/finetuned/{nccl_tuner.csv,nccl.conf} loopback/
cp "$repo"/data/h200x2-2026-11-22/store.sqlite h200x2.sqlite
cp "$repo"/data/h200x4-2026-11-21/latency/nccltests-g4.txt .
chmod u+w loopback/store.sqlite h200x2.sqlite
echo "# copied into the empty folder (the user's files):"
find . -type f | sort | tr '\n' ' '
echo; echo

step "--version" 0 5 "ncclrl --version"
step "--help" 0 40 "ncclrl --help"
for c in pretrain export finetune tune sweep validate benchmark show composer coordinator "plugin build" "plugin verify" e2e \
         decisions predict calibrate topologies parse detect profile; do
  step "$c --help" 0 4 "ncclrl $c --help"
done

step "plugin build" 0 5 "ncclrl plugin build"
step "topologies" 0 12 "ncclrl topologies"
step "decisions" 0 14 "ncclrl decisions topology=h200-2x1-sock collective=allreduce max_bytes=16M"
step "predict" 0 6 "printf 'collective,nbytes,algo,proto,channels\nallreduce,1048576,ring,simple,0\nallreduce,1048576,tree,ll,2\n' | ncclrl predict topology=h200-2x1-sock"
step "export" 0 12 "ncclrl export topology=h200-2x1-sock run_dir=export && ls export"
step "pretrain" 0 16 "ncclrl pretrain agent.total_timesteps=1024 agent.n_envs=2 agent.n_steps=256 agent.batch_size=256 'experiment.families=[socket]' check_platforms=2 run_dir=run && ls run run/table"
step "python -c gym.make" 0 4 "python -c 'import gymnasium as gym, ncclrl; env = gym.make(\"ncclrl/NcclTune-v0\"); obs, _ = env.reset(seed=0); print(env.spec.id, obs.shape, env.action_space.n, \"actions\")'"
step "detect" 0 16 "ncclrl detect logs/*.log -o detected.yaml"
step "profile" 0 16 "ncclrl profile trace/ddp-rank0.trace.json.gz -o profile.yaml"
step "profile (0 calls)" 2 4 "ncclrl profile reqlog/*.csv"
step "parse" 0 8 "ncclrl parse nccltests-g4.txt"
step "calibrate" 0 14 "ncclrl calibrate nccltests-g4.txt topology=h200-1x4 output=calibrated.yaml"
step "finetune" 0 16 "ncclrl finetune backend=replay replay_store=h200x2.sqlite topology=h200-2x1-sock budget=60s store=finetune.sqlite out=finetuned"
step "finetune strategy=ppo" 0 16 "ncclrl finetune backend=replay replay_store=h200x2.sqlite topology=h200-2x1-sock strategy=ppo serve_steps=20000 budget=90s store=finetune-ppo.sqlite out=finetuned-ppo"
step "composer" 0 16 "ncclrl composer run_dir=composer problems=4 judge=2 draws=1 train.total_timesteps=256 train.n_envs=2 train.n_steps=128 train.batch_size=128 && ls composer"
step "coordinator" 0 12 "(ncclrl coordinator port=0 port_file=port log=verdicts.jsonl & pid=\$!; for i in \$(seq 100); do [ -s port ] && break; sleep 0.1; done; exec 3<>/dev/tcp/127.0.0.1/\$(cat port); echo 'VERSION 1' >&3; head -n1 <&3; kill \$pid; wait \$pid)"
step "coordinator policy=nope" 2 4 "ncclrl coordinator policy=nope"
step "tune" 0 12 "ncclrl tune backend=replay replay_store=h200x2.sqlite topology=h200-2x1-sock method=random budget=60s store=tune.sqlite out=tuned"
step "show" 0 12 "ncclrl show finetuned/nccl_tuner.csv plot=finetuned/map.png"
step "validate" 0 16 "ncclrl validate loopback/nccl_tuner.csv conf=loopback/nccl.conf topology=h100-2x1-loopback min_bytes=8 max_bytes=64M rounds=3 samples=3 store=loopback/store.sqlite measure=false"
step "e2e" 0 10 "ncclrl e2e finetuned/nccl_tuner.csv conf=finetuned/nccl.conf topology=h200-2x1-sock device=cpu mode=ddp rounds=2 steps=3 warmup=1 timeout_s=120 out=e2e"
step "benchmark" 0 16 "ncclrl benchmark suite=ci 'suite.sets=[replay]' 'suite.replays=[{store: h200x2.sqlite, topology: h200-2x1-sock, launch: nccl}]' 'suite.methods=[default,sweep,zero-shot,jobs]' 'suite.seeds=[0]' 'suite.budgets=[0.25sweep]' out=bench"
step "benchmark (shipped ci)" 2 4 "ncclrl benchmark suite=ci 'suite.sets=[replay]' out=bench-ci"
step "sweep" 2 4 "ncclrl sweep topology=h200-2x1-sock store=sweep.sqlite"
step "plugin verify" 2 4 "ncclrl plugin verify finetuned/nccl_tuner.csv topology=h200-2x1-sock"

# every command ncclrl --help lists was run, and its --help
listed=$(ncclrl --help | sed -n '/^commands:/,/^$/p' | sed -E -n 's/^  ([a-z0-9-]+( [a-z]+)?)  +.*/\1/p')
ran=$(printf '%s\n' "${summary[@]}" | sed -E 's/ +-?[0-9]+ +[0-9]+$//')
while read -r c; do
  for want in "$c" "$c --help"; do
    grep -qxF "$want" <<<"$ran" || failed+=("$want: listed by ncclrl --help, not run here")
  done
done <<<"$listed"
echo "# commands ncclrl --help lists: $(echo "$listed" | wc -l), each run above with its --help"
echo

echo "# summary"
printf '%-22s %4s %7s\n' command exit seconds
printf '%s\n' "${summary[@]}"
echo
if (( ${#failed[@]} )); then
  echo "# FAILED:"
  printf '  %s\n' "${failed[@]}"
  exit 1
fi
echo "# every command ended as expected, none printed a traceback"
