"""Build the demo planner models: corpus, tokenizer, training (torch), GGUF export, shipped files.

Nothing here is needed at run time except
:mod:`robot_latency.models.corpus` (held-out commands for evaluation) and
:mod:`robot_latency.models.bundled` (where the shipped files are). Training needs torch.
"""
