"""``sglang-mmtrace bench``: controlled experiments whose output says which measured stage changed.

Modules: ``experiments`` (request plans), ``client`` (streaming client with client-side TTFT),
``records`` (the plugin's records for the sent rids), ``targets`` (a URL or launched servers),
``runner`` (send plans, build output lines), ``overhead`` (plugin on vs off, two servers),
``stats`` (bootstrap intervals), ``summary`` (the terminal table), ``driver`` (all of it in order).
"""

from .experiments import ALL, LAUNCHED, PER_TARGET

__all__ = ["ALL", "LAUNCHED", "PER_TARGET"]
