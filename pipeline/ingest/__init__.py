"""Ingest: files → text units (loaders) → chunks (chunking) → the store, driven by :mod:`.run`."""
