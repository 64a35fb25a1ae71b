"""Errors a user can cause. Each message names the problem and the fix; the CLI prints it and exits 2."""


class AttnlabError(Exception):
    """Base class: bad input, a bad file, or a run that cannot go on."""


class ConfigError(AttnlabError, ValueError):
    """A config field has an invalid value or name."""


class DataError(AttnlabError, ValueError):
    """A corpus, tokenizer or synthetic-task setting cannot produce training data."""


class CheckpointError(AttnlabError):
    """A checkpoint folder is missing files, truncated, corrupted or from an incompatible config."""


class TrainingDiverged(AttnlabError):
    """The loss became NaN or Inf; the last good checkpoint is kept."""
