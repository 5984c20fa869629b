"""looplab: looped (weight-tied, recurrent-depth) transformers — train, stabilise, evaluate, dissect."""

__version__ = "0.1.0"
