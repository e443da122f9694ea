"""Choosing phi per layer (`fdpp calibrate`) in modules of one job each:

    settings.py  the calibration file: reading it, the layer numbering, the one phi writer (node attributes)
    stats.py     score statistics per layer, phi choice, verdicts (pure torch on tensors, CPU-tested)
    prefill.py   which rows the float16 prefill's anchored unified max sends to the fallback
    collect.py   the scores: prompts from the text, through the reference model or the engine
    graph.py     `calibrate --apply`: the settings written onto a rewritten graph's attention nodes
    plot.py      the Figure 5 style histogram
The command itself (arguments, the run, the JSON) is fdpp_rewrite/calibrate.py.
"""
