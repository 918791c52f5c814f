"""``sglang-mmtrace bench``: controlled experiments whose output says which measured stage changed.

Modules: ``experiments`` (request plans, options), ``client`` (streaming client with client-side
TTFT), ``records`` (the plugin's records for the sent rids), ``targets`` (a URL or launched servers),
``runner`` (send plans, build output lines), ``switchctl`` (the plugin's runtime switch, from the
client side), ``overhead`` (plugin on vs off: one instance by the switch, or server pairs),
``ablation`` (the cost of each plugin part), ``throughput`` (tokens/s and CPU under load),
``procs`` (a server's processes and CPU time from /proc), ``stats`` (bootstrap and t intervals),
``summary`` (the terminal table), ``driver`` (all of it in order).
"""

from .experiments import ALL, LAUNCHED, PER_TARGET

__all__ = ["ALL", "LAUNCHED", "PER_TARGET"]
