"""Resume: which checkpoint a run goes on from, the checks that refuse one, and the run put back where it stopped.

``resume.py``: ``resume="auto"``, a path or none located (the candidates
themselves are found and agreed by ``pimm_fn.checkpoint.discovery``), the state
restored with this run's budget; ``checks.py``: what refuses a resume or warns
about it before anything is touched (hyper-parameters, optimizer and scheduler
classes against the checkpoint's).
"""
