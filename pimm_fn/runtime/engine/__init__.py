"""The engine: ``loop()`` builds a run, ``Loop`` holds it, the ``Walker`` walks its lifecycle a step at a time.

The loop in one page (the names are this package's modules)::

    loop(model, optimizer, train_data, hooks=..., **options)       # loop.py
        check every argument and option, before anything is built   # arguments.py, options.py
        bind the hooks to the model; derive what they imply once     # implied.py: Implied.of(hooks)
        make the Context and the Interpreter (one handler per effect)  # interpreter.py
        agree the setup on every rank; take the save_dir lock        # implied.py, guard.py; checkpoint.lock
        state = restore(locate(resume)) or fresh_state()             # runtime.resume
        sanity-check the evaluators on two batches                   # runtime.evaluation.sanity
        return Loop(ctx, state, step_fn, interpreter)                # run.py

    Loop.run(steps=None) -> Walker.run                                # run.py, walker.py
        while not state.finished:
            event = next_event(state)                                # core.schedule: the one lifecycle
            if event is BeforeEpoch / AfterEpoch:
                feed.start_epoch() / feed.end_epoch()                # runtime.data.feed
            if event is a step no hook is called for:
                driver.train(step); count it, outputs left unread    # runtime.step.driver, outputs.py
                continue
            if event is AfterStep:
                driver.train(step)                                   # batch, train step, scheduler step
                read the outputs a hook reads (one host sync)        # outputs.py
            state, effects = hooks(state, event)                     # core.processing: the pure fold
            guard: every rank about to run the same collectives      # guard.py (when on)
            for effect in effects, records first, saves last:
                handler(effect, state, ctx)                          # runtime.handlers
            at the step's end: a preemption signal or max_time,      # preemption.py
                agreed by every rank, saves, says one line, exits 75
        read what still waits; wait for a background save; close the logs

Every unit of that work (a fetch, the step, a fold, an effect) runs inside the
step's transaction (``transaction.py``): when anything raises, even a Ctrl-C
(held back inside the loop's own bookkeeping), the next ``run()`` or ``step()``
first finishes what the interrupted step left, exactly where it can be, and
says where it cannot. A failed step on one rank stops every rank the same way
(``peers.py``); ``Loop.replace`` swaps a hook of the live run (``swap.py``).
"""
