"""The model adapters, below generation: a model dir's looped families (Ouro, Huginn-0125, HRM-Text,
Inkling-2, one record each in :mod:`looplab.lm.families`), retrofits of a pretrained stack, and their
weights. What is done with them on text (``eval --text``, ``analyze``, fine-tuning) is :mod:`looplab.text`.
"""
