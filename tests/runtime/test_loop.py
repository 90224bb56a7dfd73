"""The loop: notebook use, the deterministic effect pass, handlers, plan equals reality."""

import json

import pytest
import torch

import pimm_fn as pf
from pimm_fn.core.effects import Evaluate, Log, SaveCheckpoint, WriteBest
from _tiny_workload import TinyNet, build, loader, negative_mse, standard_hooks


def test_step_run_state_and_trace_support_notebook_use(tmp_path):
    """step() trains one step, run(steps=n) n more, and state/trace show where the run stands."""
    _, run = build(tmp_path, max_epochs=2)
    run.step()
    assert run.state.progress.global_step == 1 and run.trace == []
    run.run(steps=2)
    assert run.state.progress.global_step == 3
    assert [type(e.effect) for e in run.trace] == [SaveCheckpoint]
    run.run(steps=2)  # step 5 ends epoch 0: the epoch's end is processed with it
    assert run.state.progress.global_step == 5 and run.state.position == "AfterEpoch"
    final = run()
    assert final is run.state and run.finished and final.progress.global_step == 10
    assert "score" in final.metrics and final.best["score"] >= final.metrics["score"]


def test_real_trace_equals_plan_with_the_metrics_the_run_published(tmp_path):
    """What a real run executes is exactly what plan() predicts, given the same metric values."""
    _, run = build(tmp_path, max_epochs=3)
    run()
    published = {e.effect.step: None for e in run.trace if isinstance(e.effect, Evaluate)}
    metrics = {}
    for entry in run.trace:
        if isinstance(entry.event, pf.events.MetricsPublished):
            metrics[entry.event.step] = dict(entry.event.values)
    assert set(metrics) == set(published) == {4, 8, 12}
    planned = pf.plan(standard_hooks(), iters_per_epoch=5, max_epochs=3, metrics=metrics)
    assert _without_outputs(run.trace) == _without_outputs(planned)


def _without_outputs(entries):
    """Entries with log records cut to (step, kind): a dry run has no losses to log."""
    shown = lambda effect: (effect.step, effect.kind) if isinstance(effect, Log) else effect
    return [(e.step, type(e.event), shown(e.effect), e.hook) for e in entries]


def test_best_model_and_checkpoint_record_the_evaluation_of_their_step(tmp_path):
    """At an evaluation step the best write precedes the save, which records the new best."""
    hooks = [pf.evaluate_every(4, negative_mse, name="val"), pf.save_every(4), pf.best_on("score")]
    _, run = build(tmp_path, hooks=hooks, max_epochs=1)
    run.run(steps=4)
    kinds = [type(e.effect) for e in run.trace]
    assert kinds == [Evaluate, WriteBest, SaveCheckpoint]
    best = json.loads((tmp_path / "model" / "model_best.json").read_text())
    assert best["step"] == 4 and best["value"] == run.state.best["score"]
    _, resumed = build(tmp_path, hooks=hooks, max_epochs=1, resume="auto")
    assert resumed.state.best["score"] == best["value"]


def test_model_best_holds_the_weights_of_the_improving_step(tmp_path):
    """model_best.pth is the model as it was when the metric improved."""
    model, run = build(tmp_path, hooks=[pf.evaluate_every(2, negative_mse), pf.best_on("score")], max_epochs=1)
    run.run(steps=2)
    at_two = {k: v.clone() for k, v in model.state_dict().items()}
    run.run(steps=1)
    saved = torch.load(tmp_path / "model" / "model_best.pth", weights_only=True)
    assert all(torch.equal(saved[k], at_two[k]) for k in at_two)


def test_log_every_writes_console_and_jsonl(tmp_path, capsys):
    """log_every's records reach the console and save_dir/log.jsonl."""
    _, run = build(tmp_path, hooks=[pf.log_every(2)], max_epochs=1)
    run.ctx.console = True
    run()
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [(r["step"], r["kind"]) for r in records] == [(2, "train"), (4, "train"), (5, "epoch")]
    assert records[-1]["loss"] > 0 and "step 2 train:" in capsys.readouterr().out


def test_a_handler_can_be_replaced(tmp_path):
    """loop(handlers=...) swaps the handler of an effect type, for tests and notebooks."""
    seen = []
    _, run = build(
        tmp_path,
        hooks=[pf.save_every(2)],
        max_epochs=1,
        handlers={SaveCheckpoint: lambda effect, state, ctx: seen.append(effect.step)},
    )
    run()
    assert seen == [2, 4, 5] and not (tmp_path / "model").exists()


def test_an_effect_without_handler_is_a_clear_error(tmp_path):
    """An effect type nobody handles names itself and the fix."""
    import attrs

    @attrs.frozen
    class Ping(pf.effects.Effect):
        step: int

    def pinger(state, event):
        return state, (Ping(event.step),) if isinstance(event, pf.events.AfterStep) else ()

    _, run = build(tmp_path, hooks=[pinger], max_epochs=1)
    with pytest.raises(pf.MissingHandlerError, match=r"no handler for effect .*Ping\(step=1\).*handlers=\{Ping: fn\}"):
        run.step()


def test_plain_function_hook_keeps_its_own_slot(tmp_path):
    """A user-written function is a hook; state.slot is its private memory across events."""

    def count_steps(state, event):
        if isinstance(event, pf.events.AfterStep):
            return pf.State.with_slot(state, (state.slot or 0) + 1), ()
        return state, ()

    _, run = build(tmp_path, hooks=[count_steps], max_epochs=2)
    assert run().slots == (10,)


def test_evaluator_may_return_a_number_or_none(tmp_path):
    """A bare number is published under the evaluator's name; None publishes nothing."""
    hooks = [
        pf.evaluate_every(1, lambda model: 0.5, name="acc"),
        pf.evaluate_every(2, lambda model: None, name="quiet"),
    ]
    _, run = build(tmp_path, hooks=hooks, max_epochs=1)
    with pytest.warns(pf.ConfigurationWarning, match="'quiet' returned None in a single-process run"):
        run.run(steps=2)
    assert dict(run.state.metrics) == {"acc": 0.5}


def test_custom_step_fn_outputs_reach_the_hooks(tmp_path):
    """step_fn replaces the default step; its scalar outputs arrive in AfterStep."""

    def step_fn(model, optimizer, batch, *, scheduler=None, scaler=None):
        return {"loss": torch.tensor(2.0), "grad_norm": 3, "logits": torch.zeros(4, 4)}

    outputs = []

    def spy(state, event):
        if isinstance(event, pf.events.AfterStep):
            outputs.append(dict(event.outputs))
        return state, ()

    _, run = build(tmp_path, hooks=[spy], max_epochs=1, step_fn=step_fn)
    run.step()
    assert outputs == [{"loss": 2.0, "grad_norm": 3.0}]


def test_default_step_explains_a_model_without_loss(tmp_path):
    """A model whose output has no 'loss' gets an error that says what to return."""

    class NoLoss(TinyNet):
        def forward(self, batch):
            return self.out(self.hidden(batch[0]))

    model = NoLoss()
    run = pf.loop(
        model, torch.optim.SGD(model.parameters(), lr=0.1), loader(), max_epochs=1, watching=pf.Watching(console=False)
    )
    with pytest.raises(
        TypeError,
        match=r"trains on model\(batch\)\['loss'\], but model\(batch\) returned a Tensor: "
        r"return \{'loss': loss, ...\}.*TrainStep\(loss_fn=...\)",
    ):
        run.step()


def test_saving_without_save_dir_is_a_clear_error():
    """A saving hook in a run without save_dir is refused at construction, saying to pass one."""
    model = TinyNet()
    with pytest.raises(ValueError, match=r"save_every\(1\) write checkpoints.*pass save_dir="):
        pf.loop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            loader(),
            hooks=[pf.save_every(1)],
            max_epochs=1,
            watching=pf.Watching(console=False),
        )


def test_bad_loop_arguments_are_refused(tmp_path):
    """Unknown checkpoint formats and duplicate evaluator names fail at construction."""
    model = TinyNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="checkpoint_format"):
        pf.loop(model, optimizer, loader(), max_epochs=1, saving=pf.Saving(checkpoint_format="zip"))
    with pytest.raises(ValueError, match="two evaluators are named 'val'"):
        pf.loop(
            model,
            optimizer,
            loader(),
            max_epochs=1,
            hooks=[pf.evaluate_every(1, negative_mse, name="val"), pf.evaluate_every(2, lambda m: 1.0, name="val")],
        )
    with pytest.raises(TypeError, match=r"pass loop\(training=pimm_fn\.Training\(iters_per_epoch=N\)\)"):
        pf.loop(model, optimizer, iter([]), max_epochs=1)


def test_model_hook_lets_the_model_take_part(tmp_path):
    """A model with on_event sees every event and may emit effects like any hook."""

    class Aware(TinyNet):
        def __init__(self):
            super().__init__()
            self.epochs_seen = []

        def on_event(self, state, event):
            if isinstance(event, pf.events.BeforeEpoch):
                self.epochs_seen.append(event.epoch)
                return state, (Log(state.progress.global_step, "model", {"epoch": event.epoch}),)
            return None

    model = Aware()
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        loader(),
        hooks=[pf.model_hook()],
        max_epochs=2,
        save_dir=tmp_path,
        watching=pf.Watching(console=False),
    )
    run()
    assert model.epochs_seen == [0, 1]
    assert [e.effect.values["epoch"] for e in run.trace] == [0, 1]


def test_load_weights_warm_starts_with_key_rewrites(tmp_path, capsys):
    """load_weights maps renamed keys, loads them before training and reports the counts."""
    source = TinyNet()
    torch.save({f"backbone.{k}": v for k, v in source.state_dict().items()}, tmp_path / "pre.pth")
    model = TinyNet()
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        loader(),
        hooks=[pf.load_weights(tmp_path / "pre.pth", replacements={"backbone.": ""})],
        max_epochs=1,
        save_dir=tmp_path / "run",
    )
    run.step()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), source.state_dict().values()))
    assert "loaded weights from" in capsys.readouterr().out


def test_load_weights_rule_that_matches_nothing_fails_loudly(tmp_path):
    """A replacement rule that matched no key is an error naming the rule."""
    torch.save(TinyNet().state_dict(), tmp_path / "pre.pth")
    model = TinyNet()
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        loader(),
        hooks=[pf.load_weights(tmp_path / "pre.pth", replacements={"encoder.": "hidden."})],
        max_epochs=1,
        watching=pf.Watching(console=False),
    )
    with pytest.raises(ValueError, match="encoder"):
        run.step()


def test_load_weights_that_match_no_parameter_fail_loudly(tmp_path):
    """A weights file none of whose keys fit the model is an error, not a silent no-op warm start."""
    torch.save({f"backbone.{k}": v for k, v in TinyNet().state_dict().items()}, tmp_path / "pre.pth")
    model = TinyNet()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        loader(),
        hooks=[pf.load_weights(tmp_path / "pre.pth")],
        max_epochs=1,
        watching=pf.Watching(console=False),
    )
    with pytest.raises(ValueError, match=r"no key of the file matches the model .*replacements="):
        run.step()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_load_weights_warm_starts_from_a_hub_safetensors_file_through_the_same_remapping(tmp_path, capsys):
    """A Hub model's model.safetensors (bf16, under its own prefix) loads through replacements and strict=True as a
    .pth does, each value converted to the model's dtype."""
    from safetensors.torch import save_file

    source = TinyNet()
    save_file(
        {f"model.{k}": v.bfloat16() for k, v in source.state_dict().items()},
        str(tmp_path / "model.safetensors"),
        metadata={"format": "pt"},
    )
    model = TinyNet()
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        loader(),
        hooks=[pf.load_weights(tmp_path / "model.safetensors", replacements={"model.": ""}, strict=True)],
        max_epochs=1,
        save_dir=tmp_path / "run",
    )
    run.step()
    assert all(torch.equal(v, source.state_dict()[k].bfloat16().float()) for k, v in model.state_dict().items())
    assert "model.safetensors: loaded 4/4 target keys; 0 missing; 0 unexpected" in capsys.readouterr().out


def test_load_weights_refuses_an_exported_safetensors_file_changed_since_and_trains_nothing(tmp_path):
    """An exported safetensors file whose tensor bytes changed fails the SHA-256 its header records: a CheckpointError
    naming it, the model untouched."""
    from pimm_fn.checkpoint.inspection import write_plain_weights

    path = tmp_path / "w.safetensors"
    write_plain_weights(path, TinyNet().state_dict(), format="safetensors")
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 1
    path.write_bytes(bytes(raw))
    model = TinyNet()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    run = pf.loop(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        loader(),
        hooks=[pf.load_weights(path)],
        max_epochs=1,
        watching=pf.Watching(console=False),
    )
    with pytest.raises(pf.CheckpointError, match="w.safetensors does not match the SHA-256 its header records"):
        run.step()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_grad_scaler_state_is_checkpointed(tmp_path):
    """An AMP GradScaler trains under autocast and its state survives a resume."""

    def make(resume):
        torch.manual_seed(0)
        model = TinyNet()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        return scaler, pf.loop(
            model,
            optimizer,
            loader(),
            hooks=[pf.save_every(2)],
            max_epochs=1,
            save_dir=tmp_path,
            watching=pf.Watching(console=False),
            training=pf.Training(scaler=scaler),
            resume=resume,
        )

    scaler, run = make(None)
    run.run(steps=2)
    saved = scaler.state_dict()
    restored, _ = make("auto")
    assert restored.state_dict() == saved
