"""The environment: Gymnasium and SB3 checkers, masks, reward sign, seeding."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import ncclrl.envs  # noqa: F401  (registers the ids)
from ncclrl.costmodel import nccl as N
from ncclrl.costmodel.errors import ConfigError
from ncclrl.costmodel.replica import eligible_mask
from ncclrl.costmodel.topology import load_topology, preset_names
from ncclrl.envs import spaces as S
from ncclrl.envs.nccl_env import NcclTuneEnv


def test_gymnasium_and_sb3_checkers_pass_without_warnings():
    env = gym.make("ncclrl/NcclTune-v0", backends=["h200-1x4", "h200-2x2-sock"]).unwrapped
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gym_check_env(env, skip_render_check=True)
        sb3_check_env(env, warn=True)


def test_action_roundtrip():
    for i in range(0, S.N_ACTIONS, 7):
        a = S.decode(i)
        assert S.encode(a.algo, a.proto, a.channels, a.chunk_factor) == i


@pytest.mark.parametrize("name", preset_names())
def test_masks_allow_only_what_nccl_can_run(name):
    topo = load_topology(name)
    elig = eligible_mask(topo)
    algo, proto, ch, chunk = S.decode_all()
    for coll in range(5):
        m = S.action_mask(topo, coll)
        assert m.any()
        assert np.all(elig[coll, algo[m], proto[m]])
        assert np.all(ch[m] <= topo.nccl.channels)
        assert np.all((chunk[m] == 0) | (proto[m] == N.SIMPLE))
        if topo.nodes == 1:  # no PAT with several GPUs per node, no NVLS Tree on one node
            assert not np.any(m & ((algo == N.PAT) | (algo == N.NVLS_TREE)))


def test_masked_sampling_never_picks_an_invalid_action():
    env = NcclTuneEnv(backends=["h200-1x4", "dgx-h100-2n"])
    rng = np.random.default_rng(0)
    env.reset(seed=0)
    for _ in range(200):
        env.reset()
        m = env.action_masks()
        a = rng.choice(np.flatnonzero(m))
        _, _, term, _, info = env.step(a)
        assert term and info["invalid_action"] is False


def test_invalid_action_is_flagged_not_timed():
    env = NcclTuneEnv(backends=["h200-1x4"])
    env.reset(seed=0, options={"collective": N.ALLREDUCE, "nbytes": 1024})
    bad = S.encode(N.PAT, N.SIMPLE, 0)
    assert not env.action_masks()[bad]
    _, r, term, _, info = env.step(bad)
    assert r == 0.0 and term and info["invalid_action"]


def test_reward_sign():
    """NCCL's own choice scores ~0; one channel for 1 GiB scores far below 0."""
    env = NcclTuneEnv(backends=["h200-1x4"], noise=False, with_optimum=True)
    env.reset(seed=0, options={"collective": N.ALLREDUCE, "nbytes": 1 << 30})
    _, r_default, *_ = env.step(S.encode(N.RING, N.SIMPLE, 0))
    env.reset(options={"collective": N.ALLREDUCE, "nbytes": 1 << 30})
    _, r_bad, _, _, info = env.step(S.encode(N.RING, N.SIMPLE, 1))
    assert abs(r_default) < 1e-9 and r_bad < -1.0 and info["regret"] > 1.0
    # On the socket bed, Tree/Simple beats NCCL's Ring/Simple at 1 MiB: positive reward.
    env = NcclTuneEnv(backends=["h200-2x2-sock"], noise=False)
    env.reset(seed=0, options={"collective": N.ALLREDUCE, "nbytes": 1 << 20})
    _, r_tree, *_ = env.step(S.encode(N.TREE, N.SIMPLE, 0))
    assert r_tree > 0.05


def test_seeded_runs_are_reproducible():
    def trace(seed):
        env = NcclTuneEnv(backends=["h200-1x4", "h200-2x2-sock"], randomize=0.5)
        out = []
        obs, _ = env.reset(seed=seed)
        for _ in range(20):
            a = int(np.flatnonzero(env.action_masks())[0])
            _, r, *_ = env.step(a)
            out.append((obs.tobytes(), r))
            obs, _ = env.reset()
        return out
    assert trace(3) == trace(3) and trace(3) != trace(4)


def test_observations_are_bounded_and_distinguish_platforms():
    a = S.observations(load_topology("h200-1x4"), N.ALLREDUCE, np.array([8, 1 << 30]))
    b = S.observations(load_topology("dgx-h100-16n"), N.ALLREDUCE, np.array([8, 1 << 30]))
    assert a.shape == (2, S.OBS_DIM) and a.dtype == np.float32
    assert a.min() >= 0 and a.max() <= 1 and b.min() >= 0 and b.max() <= 1
    assert not np.allclose(a, b) and not np.allclose(a[0], a[1])


@pytest.mark.parametrize("kwargs,field", [({"collectives": ["alltoall"]}, "collective"),
                                          ({"randomize": 2.0}, "randomize"),
                                          ({"min_bytes": 0}, "min_bytes"),
                                          ({"backends": []}, "backends")])
def test_bad_arguments(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        NcclTuneEnv(**kwargs)


def test_platform_beyond_the_observation_is_refused():
    from dataclasses import replace

    huge = replace(load_topology("dgx-h100-16n"), nodes=8192, name="huge")
    with pytest.raises(ConfigError, match="encodes at most 4096"):
        S.observations(huge, N.ALLREDUCE, np.array([8]))
