"""The DigiRL math against the worked numbers of spec/DIGIRL.md section 6."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from digirl_lite.filters import (
    awr_weights,
    effective_sample_size,
    filtered_bc_keep,
    instruction_advantage,
    keep_top_fraction,
    mc_returns,
    step_advantage,
    step_advantage_released,
    step_keep_mask,
)

V_SUCCESS = [0.30, 0.42, 0.55, 0.20, 0.55, 0.60, 0.0]
R_SUCCESS = [0, 0, 0, 0, 0, 1]
V_FAIL = [0.30, 0.42, 0.55, 0.20, 0.20, 0.18, 0.18, 0.15, 0.15, 0.12, 0.10]


def _t64(x):
    return torch.tensor(x, dtype=torch.float64)


AWR_A = [0.50, 0.30, 0.15, 0.05, 0.00, -0.10, -0.30, -0.45]


@pytest.mark.parametrize("convert", [list, np.array, _t64], ids=["list", "np", "torch"])
def test_mc_return_four_step_success(convert):
    np.testing.assert_allclose(mc_returns(convert([0.0, 0, 0, 1]), 0.5), [0.125, 0.25, 0.5, 1.0])


def test_mc_return_edge_cases():
    assert mc_returns([], 0.5).shape == (0,)
    np.testing.assert_allclose(mc_returns([1.0, 1.0], 1.0), [2.0, 1.0])
    with pytest.raises(ValueError):
        mc_returns([1.0], 1.5)


@pytest.mark.parametrize("convert", [list, np.array, _t64], ids=["list", "np", "torch"])
def test_eq43_six_step_success(convert):
    a = step_advantage(convert(V_SUCCESS), convert(R_SUCCESS), lam=0.5)
    np.testing.assert_allclose(a, [0.1475, 0.184375, -0.18125, 0.5125, 0.525, 1.0], atol=1e-12)
    keep = step_keep_mask(a, horizon=10)
    assert keep.tolist() == [True, True, False, True, True, True]  # the voice-input step dropped


def test_eq43_ten_step_failure():
    a = step_advantage(V_FAIL, [0.0] * 10, lam=0.5)
    np.testing.assert_allclose(a, [0.12, 0.13, -0.35, 0.00, -0.02, 0.00, -0.03, 0.00, -0.03, -0.02],
                               atol=1e-12)
    assert np.flatnonzero(step_keep_mask(a, horizon=10)).tolist() == [0, 1]
    # 1/H for H = 20 is 0.05
    assert step_keep_mask([0.05, 0.0501], horizon=20).tolist() == [False, True]


def test_eq43_lambda_limits():
    # lambda = 1: every step of a success gets A = 1 (Filtered BC on successes)
    np.testing.assert_allclose(step_advantage(V_SUCCESS, R_SUCCESS, lam=1.0), np.ones(6))
    # lambda = 0: the critic alone, except the final step which carries r_final
    td = np.array(V_SUCCESS[1:]) + np.array(R_SUCCESS) - np.array(V_SUCCESS[:-1])
    a0 = step_advantage(V_SUCCESS, R_SUCCESS, lam=0.0)
    np.testing.assert_allclose(a0[:-1], td[:-1], atol=1e-12)
    assert a0[-1] == pytest.approx(1.0)
    # on a failure both limits are the critic alone
    td_f = np.array(V_FAIL[1:]) - np.array(V_FAIL[:-1])
    for lam in (0.0, 1.0):
        np.testing.assert_allclose(step_advantage(V_FAIL, [0.0] * 10, lam=lam), td_f, atol=1e-12)


def test_eq43_shapes_are_checked():
    with pytest.raises(ValueError, match="T \\+ 1"):
        step_advantage([0.1, 0.2], [0.0, 1.0])
    assert step_advantage([0.0], []).shape == (0,)


def _eq43_reference(values, rewards, lam):
    """Slow, literal Eq. 4.3: one step at a time."""
    T = len(rewards)
    out = []
    for h in range(T):
        m = lam ** (T - 1 - h) * rewards[-1]
        td = values[h + 1] + rewards[h] - values[h]
        out.append(m + (1 - m) * td)
    return out


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 20).flatmap(
        lambda T: st.tuples(
            st.lists(st.floats(0, 1), min_size=T + 1, max_size=T + 1),
            st.lists(st.sampled_from([0.0, 1.0]), min_size=T, max_size=T),
        )
    ),
    st.floats(0, 1),
)
def test_eq43_matches_slow_reference(vr, lam):
    values, rewards = vr
    np.testing.assert_allclose(step_advantage(values, rewards, lam),
                               _eq43_reference(values, rewards, lam), atol=1e-12)


def test_released_step_grade():
    v, nv = V_SUCCESS[:-1], V_SUCCESS[1:]
    mc = mc_returns(R_SUCCESS, 0.5)
    raw = step_advantage_released(v, nv, R_SUCCESS, mc, clamp=False)
    np.testing.assert_allclose(raw, [0.10125, 0.1425, -0.275, 0.55, 0.50, 1.35], atol=1e-12)
    clamped = step_advantage_released(v, nv, R_SUCCESS, mc)
    np.testing.assert_allclose(clamped, [0.10125, 0.1425, 0.0, 0.55, 0.50, 1.0], atol=1e-12)
    assert (clamped > 0).tolist() == [True, True, False, True, True, True]
    with pytest.raises(ValueError, match="shape"):
        step_advantage_released(v, nv[:-1], R_SUCCESS, mc)


def test_eq44_three_trajectories():
    a = instruction_advantage([1, 1, 0], [0.8, 0.10, 0.01])
    np.testing.assert_allclose(a, [0.2, 0.9, -0.01], atol=1e-12)
    assert keep_top_fraction(a, p=0.1).tolist() == [False, True, False]


def test_eq44_buffer_of_thirty_keeps_exactly_the_medium_wins():
    scores = [0.05] * 10 + [0.70] * 5 + [-0.30] * 5 + [-0.02] * 10
    assert np.quantile(scores, 0.9) == pytest.approx(0.70)
    keep = keep_top_fraction(scores, p=0.1)
    assert keep.sum() == 5
    assert np.flatnonzero(keep).tolist() == list(range(10, 15))
    # the same through instruction_advantage, with wins at V = 0.3
    r = [1] * 10 + [1] * 5 + [0] * 5 + [0] * 10
    v = [0.95] * 10 + [0.30] * 5 + [0.30] * 5 + [0.02] * 10
    assert np.flatnonzero(keep_top_fraction(instruction_advantage(r, v))).tolist() == list(
        range(10, 15)
    )


def test_keep_top_fraction_ties_and_edges():
    assert keep_top_fraction([1.0, 1.0, 1.0]).all()  # ties kept
    assert keep_top_fraction([]).shape == (0,)
    assert keep_top_fraction([3.0, 1.0, 2.0], p=1.0).all()
    with pytest.raises(ValueError):
        keep_top_fraction([1.0, float("nan")])
    with pytest.raises(ValueError):
        keep_top_fraction([1.0], p=0.0)


def test_filtered_bc_keeps_every_success():
    r = np.array([1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0], dtype=float)  # 25% success
    assert (filtered_bc_keep(r) == (r == 1)).all()
    # under 10% success: the 90th percentile falls between 0 and 1, successes still kept
    r2 = np.zeros(30)
    r2[4] = 1
    assert np.flatnonzero(filtered_bc_keep(r2)).tolist() == [4]
    # no success: nothing to imitate (the literal rule would keep every failure)
    assert not filtered_bc_keep(np.zeros(8)).any()
    assert filtered_bc_keep(np.zeros(8), require_positive=False).all()


def test_awr_weights_and_ess():
    def share(w):
        return w.max() / w.sum()

    w1 = awr_weights(AWR_A, beta=1.0)
    assert share(w1) == pytest.approx(0.194, abs=5e-4)
    assert effective_sample_size(w1) == pytest.approx(7.39, abs=5e-3)
    w02 = awr_weights(AWR_A, beta=0.2)
    assert share(w02) == pytest.approx(0.554, abs=5e-4)
    assert effective_sample_size(w02) == pytest.approx(2.75, abs=5e-3)
    w005 = awr_weights(AWR_A, beta=0.05)
    assert share(w005) == pytest.approx(0.981, abs=5e-4)
    assert effective_sample_size(w005) == pytest.approx(1.04, abs=5e-3)
    assert effective_sample_size(awr_weights(AWR_A, beta=2.0)) == pytest.approx(7.84, abs=5e-3)
    hard = (np.array(AWR_A) > 0.1).astype(float)
    assert effective_sample_size(hard) == pytest.approx(3.0)
    assert effective_sample_size(np.zeros(3)) == 0.0
    assert awr_weights([10.0], beta=1.0, max_weight=20.0)[0] == 20.0
    with pytest.raises(ValueError):
        awr_weights(AWR_A, beta=0.0)


def test_awr_cap_at_20_as_the_reference_awr():
    """AWR's reference code clips the weight at 20 (the default ``awr_max_weight``): the
    spec's vector is untouched for beta >= 0.2 (max A / beta = 2.5 < ln 20), but at
    beta = 0.05 three steps hit the cap: the best step's share falls from 0.981 to
    20 / (60 + e + 1 + e^-2 + e^-6 + e^-9) = 0.313, the ESS rises from 1.04 to 3.37."""
    for beta in (1.0, 0.2, 2.0):
        np.testing.assert_allclose(awr_weights(AWR_A, beta, 20.0), awr_weights(AWR_A, beta))
    w = awr_weights(AWR_A, beta=0.05, max_weight=20.0)
    np.testing.assert_allclose(w[:3], 20.0)
    assert w.max() / w.sum() == pytest.approx(0.313, abs=5e-4)
    assert effective_sample_size(w) == pytest.approx(3.37, abs=5e-3)
    # a tiny beta: capped weights never overflow; uncapped ones say so
    assert awr_weights([1.0, -1.0], beta=1e-4, max_weight=20.0).tolist() == [20.0, 0.0]
    with pytest.raises(ValueError, match="max_weight"):
        awr_weights([1.0], beta=1e-4)
    with pytest.raises(ValueError, match="max_weight"):
        awr_weights([1.0], beta=1.0, max_weight=0.0)


def test_torch_inputs_with_grad_are_accepted():
    v = torch.tensor(V_SUCCESS, requires_grad=True)
    a = step_advantage(v, torch.tensor(R_SUCCESS, dtype=torch.float32))
    assert isinstance(a, np.ndarray)
    np.testing.assert_allclose(a, [0.1475, 0.184375, -0.18125, 0.5125, 0.525, 1.0], atol=1e-6)


def test_step_grades_dispatches_to_the_chosen_step_filter():
    from digirl_lite import filters

    v, r, mc = [0.2, 0.4, 0.9, 0.0], [0.0, 0.0, 1.0], [0.98, 0.99, 1.0]
    a, keep = filters.step_grades(v, r, mc, horizon=10, step_filter="paper", lam=0.5)
    np.testing.assert_allclose(a, filters.step_advantage(v, r, lam=0.5))
    np.testing.assert_array_equal(keep, filters.step_keep_mask(a, 10))
    a2, keep2 = filters.step_grades(v, r, mc, horizon=10, step_filter="released")
    np.testing.assert_allclose(a2, filters.step_advantage_released(v[:-1], v[1:], r, mc))
    np.testing.assert_array_equal(keep2, a2 > 0)
    # "none": Eq. 4.3's grades, every step kept (the voice-input mistake included)
    a3, keep3 = filters.step_grades(V_SUCCESS, R_SUCCESS, [0.0] * 6, 10, step_filter="none")
    np.testing.assert_allclose(a3, step_advantage(V_SUCCESS, R_SUCCESS))
    assert keep3.all() and a3[2] < 0
    with pytest.raises(ValueError, match="step_filter"):
        filters.step_grades(v, r, mc, horizon=10, step_filter="ppo")
