"""A short plain-torch training run learns (the model, data and loss fit together)."""

import torch

from pointcloud import PointSegNet, make_loaders


def test_few_dozen_steps_reduce_the_loss():
    """Mean loss over the last steps is well below that of the first steps."""
    torch.manual_seed(0)
    train, _ = make_loaders(96, 4, 8, seed=0, num_points=256)
    model = PointSegNet(width=32, k=8)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(3):
        for batch in train:
            loss = model(batch)["loss"]
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert len(losses) == 36
    assert sum(losses[-6:]) / 6 < 0.75 * sum(losses[:6]) / 6
