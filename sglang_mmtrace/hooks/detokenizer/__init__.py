"""Hooks run in SGLang's detokenizer process.

No state of its own: the first output of each request is emitted as ``detokenize`` through
``hooks.scheduler.state.emit`` into this process's ``join.outbox``. On SGLang 0.5.17 the plugin gets
here through ``hooks.api.detokenizer_legacy``.
"""
