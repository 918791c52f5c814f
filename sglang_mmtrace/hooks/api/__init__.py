"""Hooks run in SGLang's API process (HTTP server + TokenizerManager, one event loop).

Per-request state: ``HttpCtx`` on the ASGI scope and ``ApiTrace`` in ``join.context.LIVE`` (by rid,
only while the request is in flight), found through contextvars or by rid. ``detokenizer_legacy`` runs here too: on SGLang 0.5.17 it bootstraps the plugin
in the detokenizer process from the API process's side. Finished traces go to the collector through
``join.client``.
"""
