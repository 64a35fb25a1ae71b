"""attnlab: transformer self-attention, its sequential rivals, and measurements of why parallelism won.

Every sequence model keeps one contract: ``logits, state = model(tokens, state=None)``; see README.
"""
from attnlab.errors import AttnlabError, CheckpointError, ConfigError, DataError, TrainingDiverged

__version__ = "0.1.0"
__all__ = ["AttnlabError", "CheckpointError", "ConfigError", "DataError", "TrainingDiverged", "__version__"]
