"""``make demo``: the product working end to end on this machine (see ``run.py``)."""
