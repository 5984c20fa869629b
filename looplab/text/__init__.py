"""The text applications, above generation: evaluating a looped LM run or a model dir on text
(``looplab eval --text``, loss against loops), analysing a model dir (``looplab analyze``), the reasoning
reads, fine-tuning a retrofit (plain next-token and STARS' recipes) and the pretrained SmolLM2 stages.

The models themselves (Ouro, Huginn, HRM-Text, Inkling-2, retrofits, model dirs) are :mod:`looplab.lm`,
below :mod:`looplab.generation`.
"""
