"""NGU's embedding (inverse dynamics) and RND networks: the properties the paper relies on."""

from __future__ import annotations

import pytest
import torch

from lbc.ngu_nets import EmbeddingNet, InverseDynamics, RandomNetworkDistillation, inverse_dynamics_loss

SIZE = 36   # small frames keep the tests quick; the layers are the same as at 84x84


def _dot_frames(positions: torch.Tensor) -> torch.Tensor:
    """[N, 4, SIZE, SIZE] uint8 stacks whose newest frame shows a 6x6 block at (row, col)."""
    obs = torch.zeros(len(positions), 4, SIZE, SIZE, dtype=torch.uint8)
    for i, (r, c) in enumerate(positions.tolist()):
        obs[i, -1, r:r + 6, c:c + 6] = 255
    return obs


@pytest.mark.slow
def test_inverse_dynamics_learns_which_action_moved_the_agent() -> None:
    """Four actions move a block up/down/left/right by 6 pixels; f and h learn to tell them apart
    from (x_t, x_{t+1}) alone, which is what makes f keep only what the agent controls."""
    torch.manual_seed(0)
    moves = torch.tensor([[-6, 0], [6, 0], [0, -6], [0, 6]])
    start = torch.randint(6, 24, (128, 2))
    actions = torch.randint(0, 4, (128,))
    obs, obs_next = _dot_frames(start), _dot_frames(start + moves[actions])
    embed, head = EmbeddingNet((SIZE, SIZE)), InverseDynamics(32, 4)
    opt = torch.optim.Adam([*embed.parameters(), *head.parameters()], lr=5e-4)
    with torch.no_grad():
        first = float(inverse_dynamics_loss(embed, head, obs, obs_next, actions))
    for _ in range(200):
        opt.zero_grad()
        inverse_dynamics_loss(embed, head, obs, obs_next, actions).backward()
        opt.step()
    accuracy = (head(embed(obs), embed(obs_next)).argmax(-1) == actions).float().mean()
    assert first > 1.2 and accuracy > 0.9


def test_inverse_dynamics_penalises_only_the_head_weights() -> None:
    torch.manual_seed(1)
    embed, head = EmbeddingNet((SIZE, SIZE)), InverseDynamics(32, 4)
    obs, actions = _dot_frames(torch.randint(6, 24, (8, 2))), torch.randint(0, 4, (8,))
    with torch.no_grad():
        base = inverse_dynamics_loss(embed, head, obs, obs, actions, l2=0.0)
        with_l2 = inverse_dynamics_loss(embed, head, obs, obs, actions, l2=1e-5)
    expected = 1e-5 * sum(float(p.detach().pow(2).sum()) for n, p in head.named_parameters() if n.endswith("weight"))
    assert float(with_l2 - base) == pytest.approx(expected, rel=1e-3, abs=1e-7)


def test_rnd_error_falls_on_seen_states_and_stays_high_on_novel_ones() -> None:
    """Life-long novelty: after training the predictor on some states, their error is below that of
    states never seen; the target never changes."""
    torch.manual_seed(0)
    rnd = RandomNetworkDistillation((SIZE, SIZE))
    target_before = [p.clone() for p in rnd.target.parameters()]
    seen = _dot_frames(torch.randint(0, 12, (32, 2)))          # blocks in the top-left
    novel = _dot_frames(torch.randint(18, 30, (32, 2)))        # blocks in the bottom-right
    opt = torch.optim.Adam(rnd.predictor.parameters(), lr=5e-4)
    for _ in range(60):
        opt.zero_grad()
        rnd.error(seen).mean().backward()
        opt.step()
    with torch.no_grad():
        assert float(rnd.error(seen).mean()) < 0.5 * float(rnd.error(novel).mean())
    assert all(torch.equal(a, b) for a, b in zip(target_before, rnd.target.parameters(), strict=True))
    assert all(p.grad is None for p in rnd.target.parameters())
