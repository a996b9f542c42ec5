"""Warming: the states questions start from, computed and saved ahead of them.

* :mod:`.prefixes`: ``rag warm`` for a collection that fits the context, its prompt prefixes saved.
* :mod:`.calibration`: composition measured against exact prefill on prompts of the collection's
  own sections, before any question (what decides whether prompts are composed), and its status
  (:func:`.calibration.status`, what `rag status` shows).
* :mod:`.sections`: each section's own state, for prompts composed from them: the most useful
  first, within the room the cache has for them (``rag warm --sections``, and what ``ingest.warm``
  runs after an ingest).
* :mod:`.job`: that work in the background of a long-lived process, giving way to questions.
* :mod:`.progress`: how far it is, in tokens, with its rate and time left.
"""
