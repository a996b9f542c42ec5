"""The prefix cache: KV states of prompt prefixes on disk, so a later question starts answering at once.

:mod:`.store` (:class:`~.store.PrefixCache`: lookup, save, load, faults, sweeping),
:mod:`.index` (the SQLite index: entries, eviction, counters), :mod:`.budget` (the cap,
fixed or a share of the disk, and which states go first past it), :mod:`.keys`
(namespaces and chain hashes of token blocks), :mod:`.files` (the state files: names,
atomic writes, digests, left-overs).
"""
