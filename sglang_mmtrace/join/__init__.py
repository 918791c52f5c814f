"""How events from every process become one record per request.

``client.py`` is the API process's end (it starts the collector and sends each finished request's
``ApiTrace``), ``outbox.py`` the scheduler's and detokenizer's end (stage events and heartbeats),
``collector.py`` the collector process itself (``python -m sglang_mmtrace.join.collector``), and
``record.py`` the pure functions that build the record from the joined events.

``context.py`` (the API process's per-request state) lives here rather than at the top level or in
``hooks/api``: its wire form (``to_wire``/``from_wire``) is the format ``client.py`` sends and
``collector.py`` decodes, and ``ApiTrace`` is the API process's half of every record, so both ends of
the join read it; the API hooks import it from here.
"""
