"""The default handler of each built-in effect, in a file named like the hook's file that asks for it.

A handler is ``handler(effect, state, ctx) -> follow-up events``; it is the
only code that touches files, process groups, the console and the model.
Effects are values, dispatched by their type through ``dispatch.DEFAULT_HANDLERS``:

=============================  ==================================  ====================================
hook file (``pimm_fn.hooks``)  effects                             handlers (``pimm_fn.runtime.handlers``)
=============================  ==================================  ====================================
``checkpointing``              ``SaveCheckpoint``, ``WriteBest``   ``checkpointing``
``evaluation``                 ``Evaluate``                        ``evaluation``
``logs``                       ``Log``                             ``logs``
``warm_start``                 ``LoadWeights``                     ``warm_start``
``control``                    ``Stop``, ``StepScheduler``         ``control``
``ema``                        ``UpdateEma``                       ``ema``
``progress``                   ``ShowProgress``                    ``progress``
``profiler``                   the profiler's                      ``profiler``
=============================  ==================================  ====================================

``Call`` carries a function of the user's by name. The table, a run's own
handlers added to it, and ``Call``'s handler are in :mod:`.dispatch`.
"""
