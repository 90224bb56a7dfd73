"""What each part of a trainer checkpoint must hold, checked as it is read: a checkpoint is untrusted input.

The validators of ``pimm_fn.checkpoint.contents``' values: a state dict
where pimm_fn writes one, the recorded optimizer and scheduler classes
matching the states held, shards only where the replicated part says the
model is sharded. Each refusal says the checkpoint was not written by
pimm_fn, or was altered.
"""

__all__ = ["holding", "recorded_classes", "shards_given"]


def _names(value) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def recorded_classes(instance, attribute, value) -> None:
    """``Replicated.classes`` holds qualified class names, one for each state held: a checkpoint is untrusted input."""
    if value is None:
        return
    plain = {k: v for k, v in value.items() if k != "optimizers"} if isinstance(value, dict) else None
    if not (_names(plain) and set(plain) <= {"optimizer", "scheduler"} and _names(value.get("optimizers", {}))):
        raise ValueError(
            f"the checkpoint's record of its optimizer and scheduler classes is malformed (got {value!r:.120}); "
            f"expected {{'optimizer': name}} or {{'optimizers': {{name: name}}}}, and 'scheduler': name, qualified names"
        )
    recorded = ("optimizer" in value, "scheduler" in value, sorted(value.get("optimizers", {})))
    held = (instance.optimizer is not None, instance.scheduler is not None, sorted(instance.optimizers or {}))
    if recorded != held:  # the writer records a class for each state it writes, and only then
        raise ValueError(
            f"the checkpoint records the classes of {_objects(*recorded)}, but holds the states of "
            f"{_objects(*held)}: it was not written by pimm_fn, or was altered"
        )


def _objects(optimizer: bool, scheduler: bool, named: list) -> str:
    optimizers = f"optimizers {named}" if named else ("an optimizer" if optimizer else "no optimizer")
    return f"{optimizers} and {'a scheduler' if scheduler else 'no scheduler'}"


def holding(kind: type, *, optional: bool = True):
    """A validator: a part read from a checkpoint holds a ``kind`` (or ``None``); a checkpoint is untrusted input."""

    def check(instance, attribute, value) -> None:
        if isinstance(value, kind) or (optional and value is None):
            return
        raise ValueError(
            f"the checkpoint's {attribute.name!r} is a {type(value).__name__}, where pimm_fn writes a "
            f"{kind.__name__}{' or None' if optional else ''}: it was not written by pimm_fn, or was altered"
        )

    return check


def shards_given(instance, attribute, value):
    if value is not None and not isinstance(value, dict):
        raise TypeError(
            "TrainerContents: 'sharded' holds a sharded model's and optimizer's shards as "
            f"pimm_fn.checkpoint.sharded.state gives them (a dict), or None (got {type(value).__name__})"
        )
    if value is not None and not instance.replicated.sharded:
        raise ValueError("TrainerContents: shards given, but the replicated part does not say so (Replicated.sharded)")
