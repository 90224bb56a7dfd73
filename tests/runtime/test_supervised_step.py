"""TrainStep(loss_fn=...): a plain (input, target) classifier trains with every TrainStep option, and a batch,
an output or a step_fn that breaks a step's contract is refused naming the contract and the fix."""

import pickle

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torch.utils.data.dataloader import default_collate

import pimm_fn as pf
from _tiny_workload import same, weights

CLASSES = 3


def blobs(n=240, seed=0):
    """Three well-separated classes in 8 features: a plain classifier's data."""
    centers = torch.randn(CLASSES, 8, generator=torch.Generator().manual_seed(1234)) * 2  # every set's classes
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, CLASSES, (n,), generator=g)
    return centers[y] + torch.randn(n, 8, generator=g), y


def mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, CLASSES))


def _quiet(**kwargs):
    return pf.Watching(console=False, progress=False, **kwargs)


class Pairs(Dataset):
    """The blobs as samples of another shape: a dict under ``keys``."""

    def __init__(self, keys=("x", "y")):
        self.x, self.y = blobs()
        self.keys = keys

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {self.keys[0]: self.x[i], self.keys[1]: self.y[i], "index": i}


def _loader(shape):
    """The same batches in order, as lists (a TensorDataset's), tuples, or mappings under the usual or other keys."""
    if shape == "list":
        return DataLoader(TensorDataset(*blobs()), batch_size=16)
    if shape == "tuple":
        return DataLoader(TensorDataset(*blobs()), batch_size=16, collate_fn=lambda b: tuple(default_collate(b)))
    return DataLoader(Pairs(("x", "label") if shape == "mapping" else ("image", "target_class")), batch_size=16)


def accuracy(output, batch):
    return {"acc": (output.argmax(1) == batch[1]).sum(), "count": len(batch[1])}


def test_a_plain_classifier_trains_to_good_accuracy_with_the_supervised_step(tmp_path):
    """An MLP on (x, y) batches with TrainStep(loss_fn=cross_entropy): val/acc from under 0.7 untrained to over 0.9."""
    model = mlp()
    x, y = blobs()
    val = pf.loader_evaluator(DataLoader(TensorDataset(*blobs(seed=1)), batch_size=64), accuracy)
    before = val(model)["val/acc"]
    run = pf.loop(
        model,
        torch.optim.Adam(model.parameters(), lr=0.01),
        DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True),
        step_fn=pf.TrainStep(loss_fn=F.cross_entropy),
        hooks=[pf.evaluate_every(0, val), pf.best_on("val/acc"), pf.log_every(5)],
        max_epochs=4,
        save_dir=tmp_path,
        watching=_quiet(),
    )
    state = run()
    assert before < 0.7 and state.best["val/acc"] > 0.9, (before, state.best)
    assert run.history.columns("train")["loss"][-1] < run.history.columns("train")["loss"][0]


@pytest.mark.parametrize(
    "shape,keys", [("list", None), ("tuple", None), ("mapping", None), ("named", ("image", "target_class"))]
)
def test_tuple_list_and_mapping_batches_train_alike(shape, keys):
    """The same samples as list, tuple or mapping batches (the usual keys, or keys=): bit-identical weights."""

    def trained(shape, keys):
        model = mlp()
        pf.loop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            _loader(shape),
            step_fn=pf.TrainStep(loss_fn=F.cross_entropy, keys=keys),
            max_epochs=2,
            watching=_quiet(),
        )()
        return weights(model)

    assert same(trained(shape, keys), trained("list", None))


class WithLoss(torch.nn.Module):
    """The same network, computing the loss in forward: what the default step's contract asks of a model."""

    def __init__(self, seed=0):
        super().__init__()
        self.net = mlp(seed)

    def forward(self, batch):
        x, y = batch
        return {"loss": F.cross_entropy(self.net(x), y)}


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"device": "cpu"},
        {"precision": "bf16"},
        {"precision": "fp16"},
        {"accumulate": 3},
        {"clip_grad_norm": 0.05},
        {"clip_grad_value": 0.01},
        {"precision": "fp16", "accumulate": 2, "clip_grad_norm": 0.5},
    ],
    ids=repr,
)
def test_every_option_trains_the_supervised_step_as_it_trains_a_model_returning_its_loss(options):
    """TrainStep(loss_fn=f, **options) on net, and TrainStep(**options) on a model whose forward returns f's loss,
    end with bit-identical weights and outputs: the options are TrainStep's own, not a copy of them."""

    def trained(model, step):
        run = pf.loop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
            _loader("list"),
            step_fn=step,
            hooks=[pf.log_every(1)],
            max_epochs=2,
            watching=_quiet(),
        )
        run()
        return run

    supervised = trained(mlp(), pf.TrainStep(loss_fn=F.cross_entropy, **options))
    reference = trained(WithLoss(), pf.TrainStep(**options))
    assert same(weights(supervised.ctx.model), weights(reference.ctx.model.net))
    assert supervised.history.columns("train") == reference.history.columns("train")
    if "clip_grad_norm" in options or "clip_grad_value" in options:
        assert "grad_norm" in supervised.history.columns("train")
    if options.get("precision") == "fp16":
        assert supervised.ctx.scaler.state_dict() == reference.ctx.scaler.state_dict()
    assert supervised.state.progress.global_step == (15 // options.get("accumulate", 1)) * 2


def test_the_supervised_step_reprs_as_its_call_pickles_and_checks_its_keys():
    """repr names the loss function; pickle keeps it; keys without loss_fn, or not two names, are refused."""
    step = pf.TrainStep(loss_fn=F.cross_entropy, keys=["image", "label"], accumulate=2)
    assert repr(step) == "TrainStep(loss_fn=cross_entropy, keys=('image', 'label'), accumulate=2)"
    assert repr(pf.TrainStep(loss_fn=torch.nn.CrossEntropyLoss())) == "TrainStep(loss_fn=CrossEntropyLoss())"
    assert pickle.loads(pickle.dumps(step)) == step
    with pytest.raises(
        ValueError,
        match=r"keys=\('image', 'label'\) name the input and target of a supervised step: "
        r"pass loss_fn= too",
    ):
        pf.TrainStep(keys=("image", "label"))
    with pytest.raises(
        ValueError,
        match=r"'keys' must be None or \(input_key, target_key\), two non-empty str "
        r"\(got \('image',\)\)",
    ):
        pf.TrainStep(loss_fn=F.cross_entropy, keys=("image",))
    with pytest.raises(
        TypeError,
        match=r"'loss_fn' must be None or callable \(got 'cross_entropy'\); pass "
        r"loss_fn\(output, target\) -> loss",
    ):
        pf.TrainStep(loss_fn="cross_entropy")


# -- the contracts, said when broken ---------------------------------------------------------------------------------


def _first_step(model, step_fn=None, loader=None):
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        loader or _loader("list"),
        step_fn=step_fn,
        max_epochs=1,
        watching=_quiet(),
    )
    run.step()


def test_the_default_step_on_a_plain_classifier_says_its_contract_and_the_supervised_step():
    """model(batch) refusing a list batch is a TypeError naming the default step's contract and TrainStep(loss_fn=)."""
    with pytest.raises(TypeError) as raised:
        _first_step(mlp())
    message = str(raised.value)
    assert message.startswith(
        "the default step (no step_fn) calls model(batch) with the whole batch (a list here) "
        "and trains on its 'loss', but the model refused it: linear(): argument 'input'"
    )
    assert message.endswith(
        "For (input, target) batches pass loop(step_fn=pimm_fn.TrainStep(loss_fn=...)): it trains "
        "on loss_fn(model(input), target); else have forward take the batch and return "
        "{'loss': loss, ...}"
    )
    assert "must be Tensor, not list" in str(raised.value.__cause__)


def test_a_model_output_without_a_loss_says_the_contract():
    """A model returning predictions (a tensor, or a dict without 'loss') under the default step or TrainStep()."""

    class Predicts(torch.nn.Module):
        def __init__(self, as_dict):
            super().__init__()
            self.net, self.as_dict = mlp(), as_dict

        def forward(self, batch):
            out = self.net(batch[0])
            return {"logits": out} if self.as_dict else out

    with pytest.raises(
        TypeError,
        match=r"^the default step \(no step_fn\) trains on model\(batch\)\['loss'\], but "
        r"model\(batch\) returned a Tensor: return \{'loss': loss, ...\} from forward, "
        r"or, for a model that returns predictions, pass "
        r"loop\(step_fn=pimm_fn.TrainStep\(loss_fn=...\)\)",
    ):
        _first_step(Predicts(as_dict=False))
    with pytest.raises(
        TypeError,
        match=r"^TrainStep\(\) trains on model\(batch\)\['loss'\], "
        r"but model\(batch\) returned a dict with keys \['logits'\]",
    ):
        _first_step(Predicts(as_dict=True), pf.TrainStep())


@pytest.mark.parametrize(
    "loader,said",
    [
        (
            DataLoader(TensorDataset(*blobs(), torch.arange(240)), batch_size=16),
            "got a list of 3: have the dataset return (input, target) pairs",
        ),
        (
            DataLoader(Pairs(("image", "target_class")), batch_size=16),
            "got a dict with keys ['image', 'index', 'target_class']: name them: keys=(input_key, target_key)",
        ),
    ],
    ids=["three", "unnamed"],
)
def test_a_batch_the_supervised_step_cannot_split_says_its_contract(loader, said):
    """A triple, or a mapping without the usual keys: a TypeError naming (input, target) and the fix."""
    with pytest.raises(TypeError) as raised:
        _first_step(mlp(), pf.TrainStep(loss_fn=F.cross_entropy), loader)
    assert str(raised.value) == (
        "TrainStep(loss_fn=cross_entropy) takes (input, target) batches: a tuple or list of two, or a mapping with "
        "the input under one of ['input', 'inputs', 'x'] and the target under one of ['target', 'targets', 'label', "
        f"'labels', 'y']; {said}"
    )


def test_a_loss_that_is_not_one_number_is_refused_with_the_fix():
    """loss_fn with reduction='none' returns a loss per sample: a TypeError saying to reduce it."""
    step = pf.TrainStep(loss_fn=torch.nn.CrossEntropyLoss(reduction="none"))
    with pytest.raises(
        TypeError,
        match=r"loss_fn\(output, target\) must return the batch's loss as a one-element "
        r"tensor, to backward \(got a tensor of shape \(16,\)\): reduce it",
    ):
        _first_step(mlp(), step)


def test_a_step_fn_without_the_keywords_is_refused_when_the_loop_is_built():
    """step_fn(model, optimizer, batch) lacks scheduler=/scaler=: loop() refuses it, naming the call and the fix."""

    def step(model, optimizer, batch):
        return {}

    model = mlp()
    with pytest.raises(TypeError) as raised:
        pf.loop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            _loader("list"),
            step_fn=step,
            max_epochs=1,
            watching=_quiet(),
        )
    assert str(raised.value) == (
        "loop: step_fn test_a_step_fn_without_the_keywords_is_refused_when_the_loop_is_built.<locals>.step(model, "
        "optimizer, batch) cannot be called as the loop calls it, step_fn(model, optimizer, batch, *, "
        "scheduler=None, scaler=None) -> {'loss': loss, ...}: the scheduler and the GradScaler come as keywords "
        "(None when the run has none). Take them (def step(model, optimizer, batch, *, scheduler=None, "
        "scaler=None), or **kwargs), do one optimizer step and return its outputs"
    )


def test_a_step_fn_whose_signature_cannot_be_read_is_told_the_contract_at_its_first_call():
    """A callable with no readable signature that refuses the keywords: its first call's TypeError names the contract;
    a TypeError raised inside a step is left as it is."""

    class Opaque:
        __signature__ = "unreadable"  # inspect.signature raises on it: loop() cannot check the step beforehand

        def __call__(self, model, optimizer, batch):
            return {}

    class Raises:
        def __call__(self, model, optimizer, batch, *, scheduler=None, scaler=None):
            raise TypeError("the step's own mistake")

    with pytest.raises(
        TypeError,
        match=r"^loop: step_fn \S*Opaque cannot be called as the loop calls it, step_fn\(model, "
        r"optimizer, batch, \*, scheduler=None, scaler=None\).* \(it raised TypeError: "
        r".*unexpected keyword argument 'scheduler'\)$",
    ):
        _first_step(mlp(), Opaque())
    with pytest.raises(TypeError, match=r"^the step's own mistake$"):
        _first_step(mlp(), Raises())
