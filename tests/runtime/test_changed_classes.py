"""An optimizer or scheduler of another class than the checkpoint's: refused before anything is loaded, naming both
classes, or started fresh under resume_hyperparameters='new' (said), the model and the rest resumed."""

import attrs
import pytest
import torch
from torch.distributed.fsdp import fully_shard

import pimm_fn as pf
from pimm_fn import checkpoint
from pimm_fn.checkpoint.formats import sharded
from pimm_fn.checkpoint.contents import to_parts
from pimm_fn.core.effects import SaveCheckpoint
from pimm_fn.runtime.handlers.checkpointing import trainer_contents
from _more_state_workload import GanStep, RunningMean, TinyGan
from _process_group import one_rank_group  # noqa: F401 - a fixture
from _tiny_workload import TinyNet, loader, same_weights, weights

ADAM, SGD = "torch.optim.adam.Adam", "torch.optim.sgd.SGD"
STEP_LR, COSINE = "torch.optim.lr_scheduler.StepLR", "torch.optim.lr_scheduler.CosineAnnealingLR"


def _optimizer(kind, params):
    return torch.optim.Adam(params, lr=0.01) if kind == "adam" else torch.optim.SGD(params, lr=0.05, momentum=0.9)


def _scheduler(kind, optimizer):
    if kind is None:
        return None
    if kind == "step":
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10)


def _run(save_dir, *, optimizer="adam", scheduler=None, resume=None, model=None, **kwargs):
    torch.manual_seed(0)
    model = model or TinyNet()
    opt = _optimizer(optimizer, model.parameters())
    return model, pf.loop(
        model,
        opt,
        loader(),
        hooks=[pf.save_every(3)],
        max_epochs=2,
        save_dir=save_dir,
        scheduler=_scheduler(scheduler, opt),
        resume=resume,
        watching=pf.Watching(console=True),
        **kwargs,
    )


def _saved_at_3(save_dir, **kwargs):
    """A run that saved at step 3 and went on to step 4: the weights of step 3."""
    model, run = _run(save_dir, **kwargs)
    run.run(steps=3)
    at_3 = weights(model)
    run.run(steps=1)
    return at_3


def test_adam_to_sgd_is_a_resume_error_naming_both_classes_and_nothing_is_loaded(tmp_path):
    """Adam's state into an SGD used to load and fail at the next step with KeyError 'momentum'."""
    _saved_at_3(tmp_path)
    torch.manual_seed(0)
    model = TinyNet()
    built = weights(model)
    with pytest.raises(pf.ResumeError) as refused:
        _run(tmp_path, optimizer="sgd", resume="auto", model=model)
    said = str(refused.value)
    assert f"its optimizer is a {ADAM}, this run's is a {SGD}" in said
    assert "resume_hyperparameters='new' to start the optimizer fresh" in said
    assert same_weights(weights(model), built)  # refused before the model was touched


def test_steplr_to_cosine_is_a_resume_error_naming_both_classes(tmp_path):
    """StepLR's state used to load into a CosineAnnealingLR without a word."""
    _saved_at_3(tmp_path, scheduler="step")
    with pytest.raises(
        pf.ResumeError,
        match=rf"its scheduler is a {STEP_LR}, this run's is a {COSINE}.*"
        r"start the scheduler fresh",
    ):
        _run(tmp_path, scheduler="cosine", resume="auto")


def test_under_new_a_changed_optimizer_starts_fresh_and_trains(tmp_path, capsys):
    """resume_hyperparameters='new': the SGD starts empty with its own groups, the model is step 3's, steps run."""
    at_3 = _saved_at_3(tmp_path, scheduler="step")
    capsys.readouterr()
    model, run = _run(
        tmp_path, optimizer="sgd", scheduler="step", resume="auto", resuming=pf.Resuming(resume_hyperparameters="new")
    )
    out = capsys.readouterr().out
    assert (
        f"the optimizer in {tmp_path / 'model' / 'last'} is a {ADAM}, this run's is a {SGD}: the optimizer "
        f"starts fresh (resume_hyperparameters='new')" in out
    )
    assert same_weights(weights(model), at_3) and run.state.progress.global_step == 3
    optimizer = run.ctx.optimizer
    assert not optimizer.state and optimizer.param_groups[0]["momentum"] == 0.9
    assert run.ctx.scheduler.last_epoch == 3  # the scheduler, same class, resumed
    run()  # no KeyError: 'momentum'
    assert run.state.progress.global_step == 10 and optimizer.state


def test_under_new_a_changed_scheduler_starts_fresh_and_the_optimizer_resumes(tmp_path, capsys):
    """StepLR -> CosineAnnealingLR under 'new': the cosine schedule starts at this run's lr; Adam's moments load."""
    _, first = _run(tmp_path, scheduler="step")
    first.run(steps=3)
    moments = [s["exp_avg"].clone() for s in first.ctx.optimizer.state.values()]
    capsys.readouterr()
    _, run = _run(tmp_path, scheduler="cosine", resume="auto", resuming=pf.Resuming(resume_hyperparameters="new"))
    assert "the scheduler in" in capsys.readouterr().out
    assert run.ctx.scheduler.last_epoch == 0 and run.ctx.optimizer.param_groups[0]["lr"] == 0.01
    loaded = [s["exp_avg"] for s in run.ctx.optimizer.state.values()]
    assert len(loaded) == len(moments) and all(torch.equal(a, b) for a, b in zip(loaded, moments))
    run()
    assert run.state.progress.global_step == 10


def _old_writer(effect, state, ctx):
    """A checkpoint as pimm_fn wrote it before classes were recorded: the same parts without 'classes'."""
    contents = trainer_contents(ctx, state)
    old = attrs.evolve(contents, replicated=attrs.evolve(contents.replicated, classes=None))
    trainer, local = to_parts(old)
    assert "classes" not in trainer
    checkpoint.save_checkpoint(ctx.model_dir, step=effect.step, weights=ctx.weights(), trainer=trainer, local=local)
    return ()


def test_a_checkpoint_without_the_record_is_compared_by_its_keys_and_still_resumes_into_its_own_class(tmp_path):
    """Written before classes were recorded: Adam's groups against an SGD's (betas vs momentum) are told apart;
    the same classes resume as before."""
    _saved_at_3(tmp_path, scheduler="step", handlers={SaveCheckpoint: _old_writer})
    with pytest.raises(
        pf.ResumeError,
        match=r"its optimizer is of a class not recorded .* param groups hold "
        r"\['amsgrad', 'betas', 'eps'\] and lack \['dampening', 'momentum', "
        rf"'nesterov'\], this run's is a {SGD}",
    ):
        _run(tmp_path, optimizer="sgd", scheduler="step", resume="auto")
    with pytest.raises(
        pf.ResumeError,
        match=r"its scheduler is of a class not recorded .* hold "
        r"\['gamma', 'step_size'\] "
        rf"and lack \['T_max', 'eta_min'\], this run's is a {COSINE}",
    ):
        _run(tmp_path, scheduler="cosine", resume="auto")
    _, run = _run(tmp_path, scheduler="step", resume="auto")
    assert run.state.progress.global_step == 3 and run.ctx.optimizer.state


def _gan(save_dir, d="adam", **kwargs):
    torch.manual_seed(0)
    model = TinyGan()
    optimizers = {"g": torch.optim.Adam(model.g.parameters(), lr=0.01), "d": _optimizer(d, model.d.parameters())}
    run = pf.loop(
        model,
        optimizer=optimizers,
        train_data=loader(),
        step_fn=GanStep(RunningMean()),
        hooks=[pf.save_every(3)],
        max_epochs=1,
        save_dir=save_dir,
        watching=pf.Watching(console=True),
        **kwargs,
    )
    return run


def test_each_named_optimizer_is_checked_and_only_the_changed_one_starts_fresh(tmp_path, capsys):
    """Of optimizers g and d, d changed class: refused naming d; under 'new' d starts empty, g's state loads."""
    first = _gan(tmp_path)
    first.run(steps=3)
    g_moments = [s["exp_avg"].clone() for s in first.ctx.optimizers["g"].state.values()]
    with pytest.raises(pf.ResumeError, match=rf"its optimizer 'd' is a {ADAM}, this run's is a {SGD}"):
        _gan(tmp_path, d="sgd", resume="auto")
    capsys.readouterr()
    run = _gan(tmp_path, d="sgd", resume="auto", resuming=pf.Resuming(resume_hyperparameters="new"))
    assert "the optimizer 'd' in" in capsys.readouterr().out
    g, d = run.ctx.optimizers["g"], run.ctx.optimizers["d"]
    assert not d.state and all(torch.equal(s["exp_avg"], m) for s, m in zip(g.state.values(), g_moments))
    run()
    assert d.state


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    def forward(self, batch):
        x, y = batch
        return {"loss": ((self.body(x) - y) ** 2).mean()}


def _sharded(save_dir, optimizer="adam", **kwargs):
    torch.manual_seed(0)
    net = _Net()
    fully_shard(net.body[0])
    fully_shard(net)
    return net, pf.loop(
        net,
        _optimizer(optimizer, net.parameters()),
        loader(),
        hooks=[pf.save_every(3)],
        max_epochs=1,
        save_dir=save_dir,
        watching=pf.Watching(console=False),
        **kwargs,
    )


def test_a_sharded_models_optimizer_is_checked_before_its_shards_load(one_rank_group, tmp_path):
    """FSDP2: Adam -> SGD is refused before the shards load; under 'new' the model's shards load, the SGD is fresh."""
    net, first = _sharded(tmp_path)
    first.run(steps=3)
    at_3 = {k: v.clone() for k, v in sharded.full_weights(net).items()}
    with pytest.raises(pf.ResumeError, match=rf"its optimizer is a {ADAM}, this run's is a {SGD}"):
        _sharded(tmp_path, optimizer="sgd", resume="auto")
    net, run = _sharded(tmp_path, optimizer="sgd", resume="auto", resuming=pf.Resuming(resume_hyperparameters="new"))
    resumed = sharded.full_weights(net)
    assert all(torch.equal(resumed[k], v) for k, v in at_3.items()) and not run.ctx.optimizer.state
    run()
    assert run.state.progress.global_step == 5 and run.ctx.optimizer.state


def test_a_scheduler_on_one_side_only_is_said(tmp_path, capsys):
    """A scheduler added since the checkpoint starts fresh, one dropped loses its state: each is a console line."""
    _saved_at_3(tmp_path / "none")
    _saved_at_3(tmp_path / "step", scheduler="step")
    capsys.readouterr()
    _, added = _run(tmp_path / "none", scheduler="step", resume="auto")
    assert "holds no scheduler state: this run's scheduler starts fresh" in capsys.readouterr().out
    assert added.ctx.scheduler.last_epoch == 0
    _run(tmp_path / "step", resume="auto")
    assert "dropped the checkpoint's scheduler state: this run has no scheduler" in capsys.readouterr().out


def _altered_scheduler_writer(effect, state, ctx):
    """pimm_fn's checkpoint with its scheduler state replaced by a dict no scheduler wrote."""
    contents = trainer_contents(ctx, state)
    altered = attrs.evolve(contents, replicated=attrs.evolve(contents.replicated, scheduler={"a": 1}))
    trainer, local = to_parts(altered)
    checkpoint.save_checkpoint(ctx.model_dir, step=effect.step, weights=ctx.weights(), trainer=trainer, local=local)
    return ()


def test_a_scheduler_state_without_what_every_scheduler_keeps_is_refused_not_loaded_in_silence(tmp_path):
    """torch loads any dict into a scheduler; one without last_epoch and base_lrs is a ResumeError instead."""
    _saved_at_3(tmp_path, scheduler="step", handlers={SaveCheckpoint: _altered_scheduler_writer})
    with pytest.raises(
        pf.ResumeError, match=r"its scheduler state holds \['a'\], without \['last_epoch', 'base_lrs'\]"
    ):
        _run(tmp_path, scheduler="step", resume="auto")


class _Extra(TinyNet):
    """TinyNet with a layer more."""

    def __init__(self):
        super().__init__()
        self.extra = torch.nn.Linear(2, 2)


class _Wider(TinyNet):
    """TinyNet with two outputs: the same names, two other shapes."""

    def __init__(self):
        super().__init__()
        self.out = torch.nn.Linear(8, 2)


@pytest.mark.parametrize(
    "cls, says",
    [
        (_Extra, r"missing extra\.weight, extra\.bias"),
        (_Wider, r"other shapes out\.weight: \[1, 8\] saved, \[2, 8\] here, out\.bias: \[1\] saved, \[2\] here"),
    ],
    ids=["a layer more", "other shapes"],
)
def test_weights_of_another_model_are_refused_before_the_optimizer_loads(tmp_path, cls, says):
    """A model built otherwise than the checkpoint's: a ResumeError naming the keys and shapes that differ, the fix,
    and the run's own optimizer left as it was built (before, Adam took the checkpoint's state of the other shapes,
    then the model's load raised torch's RuntimeError)."""
    _saved_at_3(tmp_path)
    torch.manual_seed(0)
    model = cls()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    with pytest.raises(
        pf.ResumeError,
        match=rf"weights do not fit this run's {cls.__name__} \({says}\)\. Build the "
        r"model the checkpoint was written with",
    ):
        pf.loop(
            model,
            opt,
            loader(),
            hooks=[pf.save_every(3)],
            max_epochs=2,
            save_dir=tmp_path,
            resume="auto",
            watching=pf.Watching(console=False),
        )
    assert not opt.state  # nothing of the checkpoint's optimizer state was loaded
