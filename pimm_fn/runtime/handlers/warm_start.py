"""The handler of ``LoadWeights`` (``pimm_fn.hooks.warm_start``): weights from a file or checkpoint, fitted to the model.

The file is read as any warm start reads one (``pimm_fn.checkpoint.load_weights_file``:
never unpickling code), its keys remapped by the effect's replacements, and
loaded into the unwrapped model (or its shards). A request in another
dialect (pimm's) is left to the handlers of the plug-in that asks for it.
"""

from pimm_fn import checkpoint
from pimm_fn.checkpoint.formats import sharded
from pimm_fn.core.effects import LoadWeights
from pimm_fn.runtime.engine.interpreter import unwrap
from pimm_fn.runtime.errors import MissingHandlerError

__all__ = ["load_weights"]


def load_weights(effect: LoadWeights, state, ctx) -> tuple:
    """Warm start in pimm_fn's dialect; another dialect's request goes to the handler its plug-in provides."""
    if effect.dialect != "pimm_fn":
        raise MissingHandlerError(
            f"no handler for {effect!r}: a warm start in the {effect.dialect!r} dialect is carried out by the "
            f"handlers of the plug-in that asks for it; pass them to the loop (for 'pimm': "
            f"loop(handlers=pimm_fn.compat.HANDLERS))"
        )
    module = unwrap(ctx.model)
    source = checkpoint.load_weights_file(effect.path)
    targets = module.state_dict().keys()
    remapped, report = checkpoint.remap_state_dict(source, dict(effect.replacements) or None, targets)
    if not report.loaded:
        raise ValueError(
            f"load_weights({effect.path!r}): after remapping, no key of the file matches the model "
            f"(file keys look like {list(remapped)[:3]}, model keys like {list(targets)[:3]}); "
            f"pass replacements={{old_prefix: new_prefix}} to map them"
        )
    if ctx.sharded:
        sharded.load_full_weights(module, remapped, strict=effect.strict)
    else:
        module.load_state_dict(remapped, strict=effect.strict)
    ctx.say(f"loaded weights from {effect.path}: {report.summary()}")
    return ()
