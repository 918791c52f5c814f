"""Hooks run in SGLang's scheduler process (one per TP/DP rank; the scheduler loop's thread).

``state.py`` is this process's state: per-request timestamps on SGLang's ``Req`` (``req._mmtrace``, so
they die with the request) and the current prefill forward, whose GPU events are read once its result
is processed. Stage events leave through ``join.outbox``.
"""
