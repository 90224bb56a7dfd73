"""A short plain-torch training run learns (the model, data and loss fit together)."""

import torch

from pointcloud import Evaluator, PointSegNet, make_loaders


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


def test_short_training_reaches_miou_well_above_chance(tmp_path):
    """About 8 s of training through pf.loop lifts validation mIoU far above chance (~0.1).

    The default demo (512 points, 8 epochs, about a minute) reaches ~0.84;
    this is the same recipe shrunk to fit the test budget.
    """
    import pimm_fn as pf

    torch.manual_seed(0)
    train, val = make_loaders(320, 48, 16, seed=0, num_points=256)
    model = PointSegNet(width=48, k=12)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=1e-2)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=5e-3, total_steps=5 * len(train), pct_start=0.15)
    run = pf.loop(
        model,
        opt,
        train,
        hooks=[pf.evaluate_every(0, Evaluator(val, 48), name="val"), pf.best_on("mIoU")],
        max_epochs=5,
        scheduler=sched,
        save_dir=tmp_path,
        watching=pf.Watching(console=False),
    )
    state = run()
    assert state.best["mIoU"] > 0.5 and (tmp_path / "model" / "model_best.pth").is_file()
