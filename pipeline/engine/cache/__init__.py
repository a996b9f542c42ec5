"""The prefix cache: KV states of prompt prefixes on disk, so a later question starts answering at once.

:mod:`.store` (:class:`~.store.PrefixCache`: lookup, save, load, faults, sweeping),
:mod:`.index` (the SQLite index: entries, LRU eviction, counters), :mod:`.keys`
(namespaces and chain hashes of token blocks), :mod:`.files` (the state files: names,
atomic writes, digests, left-overs).
"""
