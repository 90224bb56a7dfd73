"""``plan``: the effects a hook list would execute, from a Python expression or a pimm config, without torch.

An expression is evaluated with no builtins, in a namespace holding only
pimm_fn's hook factories and ``evaluate``, a stand-in evaluator (a dry run
never calls it). A pimm config (``.py``) is read, not run: its top-level
assignments are evaluated one by one the same way, with ``dict``, ``list``
and ``tuple`` and the names assigned before, following ``_base_`` files;
its ``hooks`` list goes through ``pimm_fn.compat.build_hooks``. A ``.json``
config holds ``{"hooks": [...]}``.
"""

from __future__ import annotations

import ast
import pathlib

import attrs

import pimm_fn as pf
from pimm_fn.cli import OK, USAGE, Failure, emit
from pimm_fn.compat import build_hooks
from pimm_fn.core import untrusted_json

__all__ = ["plan", "hooks_from", "NAMESPACE"]


def evaluate(model):
    """The evaluator a planned hook list names; a dry run answers evaluations with ``--metric`` values instead."""
    raise RuntimeError("evaluate is a stand-in for planning; pass your own evaluator to loop()")


NAMESPACE = {
    **{
        name: getattr(pf, name)
        for name in (
            "save_every",
            "best_on",
            "evaluate_every",
            "log_every",
            "load_weights",
            "model_hook",
            "early_stop",
            "step_scheduler",
            "ema",
            "chain",
        )
    },
    "evaluate": evaluate,
}


def _evaluate(source: str, names: dict, what: str):
    try:
        return eval(compile(source, what, "eval"), {"__builtins__": {}}, dict(names))  # noqa: S307 - no builtins
    except NameError as exc:
        raise Failure(USAGE, f"{what}: {exc}; the names known here are {sorted(names)}") from None
    except Exception as exc:  # noqa: BLE001 - a hook factory's own validation error says what is wrong
        raise Failure(USAGE, f"{what}: {type(exc).__name__}: {exc}") from None


def _config_values(path: pathlib.Path, seen: tuple = ()) -> dict:
    """The top-level names a pimm config assigns (its ``_base_`` files' first), read without running it."""
    if path in seen:
        raise Failure(USAGE, f"{path}: its _base_ files include it again")
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        raise Failure(USAGE, f"cannot read the config {str(path)!r}: {exc}") from None
    values: dict = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue  # imports, functions, unpacking: not configuration values
        try:
            values[node.targets[0].id] = eval(  # noqa: S307 - no builtins: literals, dict(), names assigned before
                compile(ast.Expression(node.value), str(path), "eval"),
                {"__builtins__": {}},
                {"dict": dict, "list": list, "tuple": tuple, **values},
            )
        except Exception:  # noqa: BLE001 - a value we cannot read is left out; `hooks` missing is said below
            continue
        if node.targets[0].id == "_base_":
            bases = values["_base_"] if isinstance(values["_base_"], (list, tuple)) else [values["_base_"]]
            inherited = {}
            for base in bases:
                inherited.update(_config_values((path.parent / base).resolve(), (*seen, path)))
            values = {**inherited, **values}
    return values


def hooks_from(text: str) -> list:
    """The hooks ``text`` describes: a config file's path, or a Python expression of hook factory calls."""
    path = pathlib.Path(text)
    if path.suffix in (".py", ".json") and path.is_file():
        if path.suffix == ".json":
            try:
                values = untrusted_json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise Failure(USAGE, f"cannot read the config {text!r}: {exc}") from None
        else:
            values = _config_values(path.resolve())
        if not isinstance(values, dict) or not isinstance(values.get("hooks"), list):
            raise Failure(USAGE, f"{text}: no hooks list found; a pimm config assigns hooks = [dict(type=...), ...]")
        try:
            return build_hooks(values["hooks"], evaluate=evaluate, weight=values.get("weight") or "weights.pth")
        except (TypeError, ValueError) as exc:
            raise Failure(USAGE, f"{text}: {exc}") from None
    built = _evaluate(text, NAMESPACE, "HOOKS")
    return list(built) if isinstance(built, (list, tuple)) else [built]


def _metrics(pairs: list[str]) -> dict:
    values = {}
    for pair in pairs:
        name, _, number = pair.partition("=")
        try:
            values[name] = float(number)
        except ValueError:
            raise Failure(USAGE, f"--metric {pair!r}: expected NAME=VALUE with a number, e.g. mIoU=0.5") from None
    return values


def compact(value) -> str:
    """An effect's repr without the fields left at their defaults: ``SaveCheckpoint(step=4)``."""
    shown = []
    for field in attrs.fields(type(value)):
        v = getattr(value, field.name)
        if field.default is attrs.NOTHING or v != field.default:
            shown.append(f"{field.name}={dict(v) if hasattr(v, 'items') else v!r}")
    return f"{type(value).__name__}({', '.join(shown)})"


def plan(args) -> int:
    """Print the effects ``args.hooks`` would execute on the schedule given."""
    hooks = hooks_from(args.hooks)
    metrics = _metrics(args.metric)
    budget = {"max_steps": args.max_steps} if args.max_steps is not None else {"max_epochs": args.max_epochs}
    if args.max_steps is None and args.max_epochs is None:
        raise Failure(USAGE, "give the schedule's length: --max-epochs E or --max-steps S")
    try:
        trace = pf.plan(hooks, iters_per_epoch=args.iters_per_epoch, metrics=lambda step, rank: metrics, **budget)
    except (TypeError, ValueError) as exc:
        raise Failure(USAGE, str(exc)) from None
    rows = [
        {
            "step": e.step,
            "event": type(e.event).__name__,
            "hook": repr(hooks[e.hook]) if 0 <= e.hook < len(hooks) else None,
            "effect": compact(e.effect),
        }
        for e in trace
    ]
    emit({"hooks": [repr(h) for h in hooks], "effects": rows}, _table(rows), args.json)
    return OK


def _table(rows: list[dict]) -> str:
    lines = [("step", "event", "hook", "effect")]
    lines += [(str(r["step"]), r["event"], r["hook"] or "-", r["effect"]) for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(3)]
    body = [f"{a.rjust(widths[0])}  {b.ljust(widths[1])}  {c.ljust(widths[2])}  {d}" for a, b, c, d in lines]
    return "\n".join(body + [f"{len(rows)} effects"])
