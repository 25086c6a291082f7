"""Errors the user can act on. The CLI prints these as one line (exit 2), never a stack trace."""


class UserError(Exception):
    """Base class: the message must name the file / row / field / address at fault."""


class DataError(UserError):
    """Bad input data (missing column, wrong type, NaN label, empty file ...)."""


class ClusterError(UserError):
    """A parameter server or worker could not be reached or failed."""


class CheckpointError(UserError):
    """A checkpoint is missing, incomplete or does not match the model."""


class PlanError(UserError):
    """A sharding request that cannot be met (a table fits no PS, not enough memory in total)."""


class HotSetMissError(DataError):
    """A hot table served without the PS (its profile claimed every train id) met another id."""


class NetworkEmulationError(ClusterError):
    """The emulated network (``--network``) cannot be set up here, a profile is malformed, or an
    ``ip`` / ``tc`` command failed: the message names the value, the privilege or the command."""
