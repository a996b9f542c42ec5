"""Reusing computed KV state: prefix reuse, section states composed into a prompt, and their seams."""
