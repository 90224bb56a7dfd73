"""pimm's checkpoint backends and the format a pimm config asks for, in pimm_fn's terms (``PIMM.md`` 3.1)."""

__all__ = ["BACKENDS", "format_of", "checkpoint_format"]

# pimm's checkpoint backends (``CheckpointSaverIteration.backend``, ``cfg.checkpoint_format``) and their formats.
BACKENDS = {"standard": "standard", "dcp": "standard", "legacy": "legacy", "torch": "legacy"}


def format_of(value) -> str:
    """pimm_fn's ``checkpoint_format`` for pimm's ``checkpoint_format``/``backend`` value (``PIMM.md`` 3.1).

    >>> format_of("DCP"), format_of("torch")
    ('standard', 'legacy')
    """
    fmt = value.lower() if isinstance(value, str) else value
    if fmt not in BACKENDS:
        raise ValueError(f"checkpoint_format must be 'standard' or 'legacy' (or the deprecated 'dcp'/'torch'), got {value!r}")
    return BACKENDS[fmt]


def checkpoint_format(cfg) -> str:
    """The ``loop(saving=Saving(checkpoint_format=))`` of a pimm config, pimm's way (``PIMM.md`` 3.1).

    ``cfg["checkpoint_format"]`` when set, else the ``backend`` of its
    ``CheckpointSaverIteration``, else ``"standard"``; ``dcp`` and ``torch``
    are the deprecated names of ``standard`` and ``legacy``.

    >>> checkpoint_format({"hooks": [dict(type="CheckpointSaverIteration", save_freq=10, backend="torch")]})
    'legacy'
    >>> checkpoint_format({"checkpoint_format": "dcp", "hooks": []})
    'standard'
    """
    chosen = cfg.get("checkpoint_format")
    if chosen is None:
        backends = [h.get("backend") for h in cfg.get("hooks") or () if isinstance(h, dict)
                    and h.get("type") == "CheckpointSaverIteration" and h.get("backend") is not None]
        chosen = backends[0] if backends else "standard"
    return format_of(chosen)
