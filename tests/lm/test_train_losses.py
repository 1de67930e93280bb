"""The objectives of `gaca train-offline` (gaca_cli/lm/losses.py) and the training plan's pure
parts (schedule, batches, micro-batches), checked by hand and against slow twins."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gaca_cli.lm import losses as L
from gaca_cli.lm.train_config import LOSSES, TrainConfig
from gaca_cli.lm.training import BatchPlan, lr_factor, micro_batches


def test_registry_matches_the_cli_choices():
    assert tuple(L.TOKEN_LOSSES) == LOSSES


def test_clipped_surrogate_hand_computed():
    """ε_low = ε_high = 0.2 (the table in clipped_surrogate's docstring):

        r     A     r·A    clip(r)·A    ℓ       clipped
        1.5   +1    1.5    1.2         −1.2     yes
        0.5   +1    0.5    0.8         −0.5     no
        1.1   −2   −2.2   −2.2          2.2     no
        0.5   −1   −0.5   −0.8          0.8     yes

    token-mean = (−1.2 − 0.5 + 2.2 + 0.8) / 4 = 1.3 / 4 = 0.325;
    ∂(token-mean)/∂log π = (0, −0.5·1, −1.1·(−2), 0) / 4 = (0, −0.125, 0.55, 0).
    """
    behavior = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    ratio = torch.tensor([1.5, 0.5, 1.1, 0.5])
    logp = (behavior + torch.log(ratio)).clone().requires_grad_(True)
    adv = torch.tensor([1.0, 1.0, -2.0, -1.0])
    loss, r, clipped = L.clipped_surrogate(logp, behavior, adv, 0.2, 0.2)
    torch.testing.assert_close(loss, torch.tensor([-1.2, -0.5, 2.2, 0.8]), rtol=0, atol=1e-6)
    assert clipped.tolist() == [True, False, False, True]
    torch.testing.assert_close(r, ratio, rtol=0, atol=1e-6)
    weights = L.token_weights(torch.arange(4), torch.ones(4, dtype=torch.long), "token-mean", 4, 4)
    total = (weights * loss).sum()
    assert total.item() == pytest.approx(0.325, abs=1e-6)
    total.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, -0.125, 0.55, 0.0]), rtol=0, atol=1e-6)


def test_asymmetric_clip():
    """ε_high = 0.28 (DAPO): r = 1.25, A = 1 is inside [0.8, 1.28] so unclipped: ℓ = −1.25."""
    behavior = torch.tensor([0.0])
    loss, _, clipped = L.clipped_surrogate(torch.log(torch.tensor([1.25])), behavior, torch.tensor([1.0]), 0.2, 0.28)
    assert loss.item() == pytest.approx(-1.25) and not clipped.item()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", ["ppo", "pg"])
def test_zero_advantage_gives_zero_gradient(name, seed):
    """A = 0 on every token: the ppo and pg losses and their gradients are exactly zero, with
    or without importance weights, whatever π and μ are."""
    gen = torch.Generator().manual_seed(seed)
    n = 17
    logp = (-torch.rand(n, generator=gen) * 5).requires_grad_(True)
    behavior = -torch.rand(n, generator=gen) * 5
    adv = torch.zeros(n)
    config = TrainConfig(model="-", loss=name, is_cap=2.0 if name == "pg" else None)
    loss, _ = L.policy_token_loss(name, logp, adv, behavior, config)
    (loss.sum()).backward()
    assert torch.count_nonzero(loss) == 0
    assert torch.count_nonzero(logp.grad) == 0


def test_policy_gradient_truncated_weights():
    """log π = −2, A = 0.5, r = 3, c = 2: w = min(3, 2) = 2, ℓ = −2·0.5·(−2) = 2, ∂ℓ/∂log π = −w·A = −1
    (the weight is a constant: no gradient flows through r)."""
    logp = torch.tensor([-2.0], requires_grad=True)
    behavior = torch.tensor([-2.0 - math.log(3.0)])
    loss, w = L.policy_gradient(logp, torch.tensor([0.5]), behavior, is_cap=2.0)
    assert w.item() == pytest.approx(2.0) and loss.item() == pytest.approx(2.0)
    loss.sum().backward()
    assert logp.grad.item() == pytest.approx(-1.0)
    plain, w1 = L.policy_gradient(torch.tensor([-2.0]), torch.tensor([0.5]))
    assert w1.item() == 1.0 and plain.item() == pytest.approx(1.0)


def test_awr_weights_and_loss():
    """w = min(exp(A/τ), w_max): A = (1, −1, 10), τ = 1, w_max = 20 → (e, 1/e, 20);
    ℓ = −w·log π with log π = −3 → (8.155, 1.104, 60)."""
    adv = torch.tensor([1.0, -1.0, 10.0])
    loss, w = L.advantage_weighted_regression(torch.full((3,), -3.0), adv, 1.0, 20.0)
    torch.testing.assert_close(w, torch.tensor([math.e, 1 / math.e, 20.0]))
    torch.testing.assert_close(loss, torch.tensor([3 * math.e, 3 / math.e, 60.0]))


def test_filtered_bc_keeps_steps_above_threshold():
    loss, keep = L.filtered_bc(torch.tensor([-1.0, -2.0, -3.0]), torch.tensor([0.5, 0.0, -1.0]), 0.0)
    assert keep.tolist() == [1.0, 0.0, 0.0]
    torch.testing.assert_close(loss, torch.tensor([1.0, 0.0, 0.0]))


def test_kl_k3_values_and_gradient():
    """δ = log π_ref − log π: δ = log 2 → 2 − log 2 − 1 = 0.30685; δ = 0 → 0 (and zero gradient);
    ∂k3/∂log π = 1 − exp(δ): −1 at δ = log 2."""
    logp = torch.tensor([0.0, -1.0], requires_grad=True)
    ref = torch.tensor([math.log(2.0), -1.0])
    kl = L.kl_k3(logp, ref)
    torch.testing.assert_close(kl, torch.tensor([2 - math.log(2) - 1, 0.0]))
    kl.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([-1.0, 0.0]))
    assert (L.kl_k3(torch.randn(50), torch.randn(50)) >= 0).all()


def test_token_weights_examples():
    """Two sequences of 1 and 3 action tokens: token-mean (¼, ¼, ¼, ¼), seq-mean (½, ⅙, ⅙, ⅙)."""
    seq = torch.tensor([0, 1, 1, 1])
    lengths = torch.tensor([1, 3])
    torch.testing.assert_close(L.token_weights(seq, lengths, "token-mean", 4, 2), torch.full((4,), 0.25))
    torch.testing.assert_close(
        L.token_weights(seq, lengths, "seq-mean", 4, 2), torch.tensor([0.5, 1 / 6, 1 / 6, 1 / 6])
    )


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean"])
def test_token_weights_split_like_one_batch(aggregation):
    """Weights computed per micro-batch with the step's global counts add up to the one-batch
    loss: Σ over micro-batches of Σ c_t ℓ_t equals the loop-computed mean."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 6, size=7)
    losses = [rng.normal(size=k) for k in lengths]
    if aggregation == "token-mean":
        expected = np.concatenate(losses).mean()
    else:
        expected = np.mean([x.mean() for x in losses])
    total = 0.0
    for part in ([0, 1, 2], [3], [4, 5, 6]):
        seq = torch.from_numpy(np.repeat(np.arange(len(part)), lengths[part]))
        ell = torch.from_numpy(np.concatenate([losses[i] for i in part]))
        c = L.token_weights(seq, torch.from_numpy(lengths[part]), aggregation, float(lengths.sum()), 7.0)
        total += float((c.double() * ell).sum())
    assert total == pytest.approx(expected, abs=1e-6)


def test_lr_schedule_example():
    """total = 10, W = 2, m = 0: 0.5, 1, then ½(1 + cos(π k / 8)) for k = 0..7."""
    got = [lr_factor(s, 10, 2, 0.0) for s in range(10)]
    want = [0.5, 1.0] + [0.5 * (1 + math.cos(math.pi * k / 8)) for k in range(8)]
    assert got == pytest.approx(want)
    assert got[3] == pytest.approx(0.9619, abs=1e-4) and got[4] == pytest.approx(0.8536, abs=1e-4) and got[-1] > 0
    assert lr_factor(0, 5, 0, 0.1) == pytest.approx(1.0)
    assert lr_factor(4, 5, 0, 0.1) > 0.1


def test_batch_plan_is_a_permutation_per_epoch_and_deterministic():
    plan = BatchPlan(10, 4, seed=3)
    assert plan.steps_per_epoch == 3
    for epoch in range(2):
        seen = np.concatenate([plan.batch(epoch * 3 + k) for k in range(3)])
        assert sorted(seen.tolist()) == list(range(10))
    again = BatchPlan(10, 4, seed=3)
    assert again.batch(4).tolist() == plan.batch(4).tolist()
    assert plan.batch(0).tolist() != plan.batch(3).tolist()  # another epoch, another order


@pytest.mark.parametrize("world", [1, 2, 3])
def test_micro_batches_cover_each_sequence_once_within_budget(world):
    rng = np.random.default_rng(world)
    lengths = rng.integers(1, 50, size=23)
    seen = []
    for rank in range(world):
        for mb in micro_batches(lengths, 100, rank, world):
            longest = lengths[mb].max()
            assert len(mb) * longest <= 100 or len(mb) == 1
            seen.extend(mb.tolist())
    assert sorted(seen) == list(range(23))


def test_config_messages_name_field_value_and_fix():
    with pytest.raises(ValueError, match=r"lr = -1.0 is not valid; use a peak learning rate > 0"):
        TrainConfig(model="m", lr=-1.0)
    with pytest.raises(ValueError, match="loss = 'dpo'"):
        TrainConfig(model="m", loss="dpo")
    with pytest.raises(ValueError, match="merge.*--lora-r"):
        TrainConfig(model="m", merge=True)
    with pytest.raises(ValueError, match="is_cap.*--loss pg"):
        TrainConfig(model="m", loss="ppo", is_cap=2.0)
