"""The warning a resume gives when it cannot continue exactly as the original run would have."""

__all__ = ["ResumeNotExactWarning"]


class ResumeNotExactWarning(UserWarning):
    """A resumed run will not see exactly the batches the original would have."""
